"""The ctr-ps workload's data: Criteo click logs (criteo.py's text format) to record shards (`prepare-data --format
criteo`); the holdout is the end of every file, as for text."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from efa_training.workloads.ctr_ps import criteo
from efa_training.workloads.ctr_ps.criteo import SPLITS


def prepare_criteo(files: list[Path], output: Path, val_fraction: float, shard_records: int) -> dict:
    """Criteo text (criteo.py) to record shards; the holdout is the end of every file, as for text."""
    output.mkdir(parents=True, exist_ok=True)
    parts: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as text:
            lines = [line for line in text if line.strip()]
        cut = len(lines) - int(round(len(lines) * val_fraction))
        parts["train"].append(criteo.parse_lines(lines[:cut], str(f)))
        parts["val"].append(criteo.parse_lines(lines[cut:], str(f)))
    info: dict = {"format": "criteo", "record_bytes": criteo.CTR_RECORD.itemsize, "files": len(files), "splits": {}}
    for split, chunks in parts.items():
        records = np.concatenate(chunks)
        for old in output.glob(f"{split}_*"):
            old.unlink()  # a re-run must not leave shards of a previous, larger input behind
        n_shards = -(-len(records) // shard_records)
        for i in range(n_shards):
            chunk = records[i * shard_records : (i + 1) * shard_records]
            criteo.write_records(output / f"{split}_{i:06d}{criteo.SUFFIX}", chunk)
        info["splits"][split] = {
            "records": len(records),
            "shards": n_shards,
            "click_rate": round(float(records["label"].mean()), 4) if len(records) else None,
        }
    (output / "dataset.json").write_text(json.dumps(info, indent=2) + "\n")
    return info

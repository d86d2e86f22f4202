"""What the GPT workload refuses before any process group exists, each with one line and exit code 2 (or 4, diverged).

The platform's checks first (runtime/preflight.py), then the data, a repeat of a diverged run, and the checkpoint
folder. Every rank runs the same checks on the same inputs, so all ranks reach the same verdict without a collective.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from efa_training.checkpointing.reuse import check_reusable
from efa_training.runtime.divergence import check_not_diverged
from efa_training.runtime.errors import UsageError
from efa_training.runtime.preflight import check_platform, probe_writable
from efa_training.workloads.gpt.data import list_shards, max_token_id, open_shard
from efa_training.workloads.gpt.sizes import ModelConfig

if TYPE_CHECKING:
    from efa_training.train_config import TrainConfig


def check_before_start(cfg: TrainConfig, expected_nodes: int | None) -> None:
    check_platform(expected_nodes, cfg.device)
    check_data(Path(cfg.data), cfg.model_config())
    check_not_diverged(cfg)
    # A wrong or unwritable --checkpoint-dir fails in one line, not at the first save.
    check_reusable(Path(cfg.checkpoint_dir), cfg.strategy, cfg.model, asdict(cfg.model_config()))
    probe_writable(Path(cfg.checkpoint_dir))


def check_data(data_dir: Path, mcfg: ModelConfig) -> None:
    """A wrong --data is the commonest mistake; token ids beyond the vocabulary would end in an IndexError (a
    device-side assert on GPU) mid-run. The largest id of each shard is in its header: one number per shard."""
    tokens = 0
    for shard in list_shards(data_dir, "train"):
        tokens += open_shard(shard).size
        largest = max_token_id(shard)
        if largest is not None and largest >= mcfg.vocab_size:
            raise UsageError(
                "shard",
                str(shard),
                f"holds token id {largest}, beyond the model's vocabulary of {mcfg.vocab_size} ids",
                "shards tokenized for this model's vocabulary",
            )
    if tokens < mcfg.seq_len + 1:
        raise UsageError(
            "--seq-len",
            mcfg.seq_len,
            f"the train split of {data_dir} has only {tokens} tokens",
            f"at most {max(tokens - 1, 0)} for this data, or more data",
        )

"""Turn text files into uint16 token shards with a byte-level tokenizer.

    python -m efa_training.prepare_data --input corpus/ --output /fsx/datasets/wikitext --val-fraction 0.05

Byte-level: each UTF-8 byte is a token (0..255), 256 separates documents (one
file = one document). No vocabulary file and no network. The holdout split is
taken from the end of every document, so both splits see every source.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from efa_training import workloads
from efa_training.runtime.errors import UsageError, exit_with_usage_error

TEXT_SUFFIXES = {".txt", ".md", ".text", ".rst", ".py", ".json", ".csv", ".tsv", ""}


def find_inputs(inputs: list[str]) -> list[Path]:
    files: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            files += sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in TEXT_SUFFIXES)
        elif p.is_file():
            files.append(p)
        else:
            raise UsageError("--input", item, "no such file or directory", "text files or folders of them")
    if not files:
        raise UsageError("--input", inputs, "no text files found", f"files ending in {sorted(TEXT_SUFFIXES)}")
    return files


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", required=True, help="text files or directories (searched recursively)")
    p.add_argument("--output", required=True, help="directory for {train,val}_NNNNNN.bin shards and dataset.json")
    p.add_argument(
        "--val-fraction",
        type=float,
        default=0.05,
        help="fraction of each document held out for validation (default 0.05)",
    )
    p.add_argument(
        "--shard-tokens",
        type=int,
        default=100_000_000,
        help="tokens per shard file (default 100M = 200 MB); with --format criteo, records per shard (157 bytes each)",
    )
    p.add_argument(
        "--format",
        choices=("text", "criteo"),
        default="text",
        help="text: byte-level token shards for the GPT models; criteo: Criteo click logs (label, 13 integers, "
        "26 hex hashes per line) to record shards for the ctr-* models (default text)",
    )
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if not 0.0 < args.val_fraction < 1.0:
            raise UsageError("--val-fraction", args.val_fraction, "out of range", "0 < fraction < 1")
        if args.shard_tokens < 1:
            raise UsageError("--shard-tokens", args.shard_tokens, "must be positive", ">= 1")
        out = Path(args.output)
        if out.exists() and not out.is_dir():
            raise UsageError("--output", args.output, "is a file", "a directory (created if missing)")
        info = workloads.prepare_data(args.format, find_inputs(args.input), out, args.val_fraction, args.shard_tokens)
    except UsageError as err:
        exit_with_usage_error("prepare_data.py", err)
    print(json.dumps({"prepare_data": info}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

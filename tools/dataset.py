"""Prepare a dataset and upload it where runs read it: s3://<data bucket>/datasets/<name>/, manifest last.

    make dataset ENV=dev NAME=mytexts INPUT=path/to/texts        # your text files (a folder or files)
    make dataset ENV=dev NAME=sample SYNTHETIC=1                 # a small generated English-like corpus
    python -m tools.dataset dev mytexts --input a.txt b/ [--format criteo] [--region R] [--dry-run]

It runs the image's own prepare_data.py (byte-level token shards for the GPT models; `--format criteo`: click-log
records for the ctr-* models) into a temporary folder, uploads the shards and then `dataset.json`, the manifest the
pipeline's first states and `pipeline_cli start` look for, and prints a run file that names the dataset. With
`--dry-run` it prepares and prints without uploading (no credentials needed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import tempfile
from pathlib import Path

from config.layout import DATASET_MANIFEST, DATASETS_PREFIX
from contracts.run import DATASET_PATTERN
from tools.pipeline_cli import CliError, Pipeline, call, region_of

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "training_image"))  # the training image's package, efa_training

EXAMPLE = json.loads((ROOT / "examples" / "run.json").read_text())
# The first run of each format: what examples/run.json trains (workload gpt), or the smallest click-through model
# (workload ctr-ps).
FIRST_RUN = {
    "text": {"hyperparameters": EXAMPLE["hyperparameters"]},
    "criteo": {
        "workload": "ctr-ps",
        "hyperparameters": {"model": "ctr-tiny", "strategy": "ps", "max_steps": 1000, "batch_size": 512, "lr": 0.02},
    },
}


def prepare(inputs: list[str], synthetic: bool, fmt: str, out: Path) -> dict:
    """prepare_data.py's own output in `out` (its manifest, returned)."""
    from efa_training import prepare_data
    from efa_training.workloads.gpt import sample as synthetic_corpus

    if synthetic:
        inputs = [str(path) for path in synthetic_corpus.write_corpus(out.parent / "corpus")]
    with contextlib.redirect_stdout(sys.stderr):  # stdout is the run file alone
        code = prepare_data.main(["--input", *inputs, "--output", str(out), "--format", fmt])
    if code != 0:
        raise CliError(f"prepare_data.py failed with exit {code}")
    return json.loads((out / DATASET_MANIFEST).read_text())


def upload(pipeline: Pipeline, folder: Path, prefix: str) -> str:
    """Every shard, then the manifest: a reader that sees dataset.json sees a complete dataset."""
    bucket = pipeline.bucket
    if bucket is None:
        raise CliError(f"environment {pipeline.env!r} has no data bucket output (is its storage stack deployed?)")
    s3 = pipeline._client("s3")
    files = sorted(p for p in folder.iterdir() if p.name != DATASET_MANIFEST) + [folder / DATASET_MANIFEST]
    for path in files:
        call(s3.upload_file, Filename=str(path), Bucket=bucket, Key=prefix + path.name)
    return f"s3://{bucket}/{prefix}"


def run_file(name: str, fmt: str) -> dict:
    run = {**EXAMPLE, "run_id": f"{name}-001", "dataset": f"{DATASETS_PREFIX}{name}/"}
    return {**run, **FIRST_RUN[fmt]}


def main(argv: list[str] | None = None, *, session=None) -> int:
    args = parser().parse_args(argv)
    try:
        prefix = f"{DATASETS_PREFIX}{args.name}/"
        if not re.fullmatch(DATASET_PATTERN, prefix) or "/" in args.name:
            raise CliError(f"name={args.name!r} is not valid; expected ASCII letters, digits, '_', '-' and inner dots")
        if not args.input and not args.synthetic:
            raise CliError("nothing to prepare: give --input <files or folders> or --synthetic")
        with tempfile.TemporaryDirectory() as scratch:
            info = prepare(args.input, args.synthetic, args.format, Path(scratch) / "dataset")
            where = "not uploaded (--dry-run)"
            if not args.dry_run:
                pipeline = Pipeline(args.env, region_of(args.env, args.region), session=session)
                where = upload(pipeline, Path(scratch) / "dataset", prefix)
        print(f"dataset {prefix}: {json.dumps(info['splits'])}; {where}", file=sys.stderr)
        print(json.dumps(run_file(args.name, args.format), indent=2))
        return 0
    except CliError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tools.dataset", description=__doc__.split("\n\n")[0])
    p.add_argument("env")
    p.add_argument("name", help=f"the dataset's folder: {DATASETS_PREFIX}<name>/ in the data bucket")
    p.add_argument("--input", nargs="*", default=[], help="text files or folders (criteo: click-log files)")
    p.add_argument("--synthetic", action="store_true", help="a small generated English-like corpus instead")
    p.add_argument("--format", choices=sorted(FIRST_RUN), default="text")
    p.add_argument("--region", help="AWS region (default: the environment's region in cdk.json)")
    p.add_argument("--dry-run", action="store_true", help="prepare and print the run file; upload nothing")
    return p


if __name__ == "__main__":
    sys.exit(main())

r"""Evaluate a checkpoint on the holdout split and compare with a baseline.

    python -m efa_training.validate --checkpoint /fsx/checkpoints/run-7 --data /fsx/datasets/wikitext \
        --baseline 3.2 --verdict-prefix s3://<data bucket>/runs/ --run-id run-7
(the pipeline's layout, config/layout.py: the verdict lands at s3://<data bucket>/runs/run-7/verdict.json)

Metric: mean cross-entropy per token on val_*.bin (`val_loss`, lower is better; perplexity
is reported too). Accept when value <= baseline * (1 + tolerance). With no baseline at the
given location this run becomes the baseline: it is written there and the verdict passes.

Verdict JSON: {"metric","value","baseline","delta","relative_delta","tolerance","passed", ...}
written to a path or straight to s3://bucket/key (the Step Functions pipeline reads it with
s3:GetObject; an FSx export to S3 would arrive asynchronously, too late to branch on).
Exit 0 for accept and reject alike (the pipeline branches on `passed`); 1 for a runtime
error (unreadable checkpoint, S3 failure); 2 for bad usage.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch

from efa_training import workloads
from efa_training.runtime import tracking
from efa_training.runtime.console import log
from efa_training.runtime.distributed import resolve_device
from efa_training.runtime.errors import UsageError, exit_with_usage_error
from efa_training.runtime.run_paths import add_layout_flags, checkpoint_dir
from efa_training.runtime.storage import read_json, under_prefix, write_json
from efa_training.workloads.gpt.evaluate import METRIC  # a baseline's default metric: the GPT's val_loss

EXIT_ERROR = 1
# The pipeline passes the run's tolerance (contracts/run.py, the same default: tests/training/test_run_contract.py).
DEFAULT_TOLERANCE = 0.001
DEVICES = ("auto", "cuda", "cpu")  # evaluation is fp32 on one device; no XLA path


def baseline_value(doc: dict, location: str, metric: str = METRIC) -> float:
    # Accept a previous verdict/baseline ({"metric","value"}) or a plain metrics file ({"val_loss": x}).
    def usable(x) -> bool:  # a NaN/Infinity baseline (json.loads accepts them) would accept or reject anything
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    if doc.get("metric", metric) == metric and usable(doc.get("value")):
        return float(doc["value"])
    if usable(doc.get(metric)):
        return float(doc[metric])
    raise UsageError(
        "--baseline",
        location,
        f"no finite numeric '{metric}' or 'value' of metric {metric!r} in the JSON",
        f'{{"metric": "{metric}", "value": <float>}} or {{"{metric}": <float>}}',
    )


def resolve_baseline(spec: str, record: dict, verdict_at: str) -> tuple[float | None, str | None, bool]:
    """(baseline value, where it came from or was written, whether this run became the baseline)."""
    spec = spec.strip()
    try:
        number = float(spec)  # a number given directly (the pipeline's `baseline` parameter)
    except ValueError:
        number = None
    if number is not None:
        if not math.isfinite(number):
            raise UsageError("--baseline", spec, "not a finite number", "a finite val_loss, a JSON location, or none")
        return number, None, False
    usable = record["value"] is not None  # a diverged run (non-finite loss) never becomes the baseline
    if spec.lower() in ("", "none"):
        where = verdict_at.rsplit("/", 1)[0] + "/baseline.json" if "/" in verdict_at else None
        if where and usable:
            write_json(where, record)
        return record["value"], where if usable else None, usable
    existing = read_json(spec)
    if existing is None:
        if usable:
            write_json(spec, record)
        return record["value"], spec, usable
    return baseline_value(existing, spec, record["metric"]), spec, False


def perplexity(value: float | None) -> float | None:
    # exp overflows above ~709.78; such a model is diverged and its perplexity is not a number worth writing.
    if value is None or not math.isfinite(value) or value > math.log(sys.float_info.max):
        return None
    return math.exp(value)


def verdict(value: float | None, baseline: float | None, tolerance: float, metric: str = METRIC) -> dict:
    """Accept when value <= baseline*(1+tolerance). A non-finite value (diverged model) is rejected with
    value/delta/perplexity null, so the document stays strict JSON for the pipeline's StringToJson."""
    value = value if value is not None and math.isfinite(value) else None
    delta = relative = None
    passed = False
    if value is not None and baseline is not None and math.isfinite(baseline):
        delta = value - baseline
        relative = delta / baseline if baseline else None
        passed = value <= baseline * (1 + tolerance)
    return {
        "metric": metric,
        "value": value,
        "baseline": baseline,
        "delta": delta,
        "relative_delta": relative,
        "tolerance": tolerance,
        "passed": bool(passed),
        "perplexity": perplexity(value) if metric == METRIC else None,
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_what_flags(p)
    _add_verdict_flags(p)
    p.add_argument("--batch-size", type=int, default=16, help="windows per forward pass (default 16)")
    p.add_argument("--max-batches", type=int, default=0, help="evaluate at most N batches; 0 = whole split")
    p.add_argument(
        "--device", default="auto", help="auto (ACCELERATOR_KIND's GPU, else cuda if present, else cpu), cuda or cpu"
    )
    return p


def _add_what_flags(p: argparse.ArgumentParser) -> None:
    """Which checkpoint, on which data, for which run and model."""
    env = os.environ.get
    p.add_argument(
        "--checkpoint",
        default=env("CHECKPOINT_DIR"),
        help="a step_* checkpoint, or a --checkpoint-dir (its newest loadable checkpoint is used) "
        "(default: env CHECKPOINT_DIR, else --checkpoints-root/--run-id)",
    )
    p.add_argument(
        "--data",
        default=env("DATA_DIR"),
        help="dataset directory from prepare_data.py; its val split is used "
        "(default: env DATA_DIR, else --datasets-root/--dataset)",
    )
    add_layout_flags(p)
    p.add_argument(
        "--run-id",
        default=env("RUN_ID"),
        help="run id: names the checkpoint dir under --checkpoints-root and the verdict under "
        "--verdict-prefix (default: env RUN_ID)",
    )
    p.add_argument("--model", default=None, help="expected model size; an error if the checkpoint holds another")


def _add_verdict_flags(p: argparse.ArgumentParser) -> None:
    """The baseline, where the verdict goes, and the tolerance it is judged with."""
    env = os.environ.get
    p.add_argument(
        "--baseline",
        default=env("BASELINE_URI", ""),
        help="a number, or a baseline JSON at a path or s3://bucket/key (if absent there, this run is "
        "written there as the new baseline); 'none' or empty: no baseline, this run becomes it "
        "(written as baseline.json beside the verdict) (default: env BASELINE_URI)",
    )
    p.add_argument(
        "--verdict",
        default=env("VERDICT_URI", ""),
        help="write the verdict JSON to this path or s3://bucket/key (default: env VERDICT_URI)",
    )
    p.add_argument(
        "--verdict-prefix",
        default=env("VERDICT_PREFIX", ""),
        help="write the verdict to PREFIX<run-id>/verdict.json, PREFIX a path or s3://bucket/prefix/ "
        "(default: env VERDICT_PREFIX)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help="relative tolerance: accept if value <= baseline*(1+tolerance) (default %(default)s)",
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        device, verdict_at = check_flags(args)
        result = _validate(args, device, verdict_at)
        if verdict_at:
            write_json(verdict_at, result)
    except UsageError as err:
        exit_with_usage_error("validate.py", err)
    except Exception as exc:  # runtime failure: the pipeline must not read a stale verdict as fresh
        print(f"validate.py: error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return EXIT_ERROR
    print(json.dumps({"verdict": result}, allow_nan=False), flush=True)
    tracking.record_verdict(os.environ, args.run_id or os.environ.get("RUN_ID", "local"), result)
    return 0


def check_flags(args: argparse.Namespace) -> tuple[torch.device, str]:
    """The evaluation device and where the verdict goes, after every flag is checked."""
    if not 0 <= args.tolerance < math.inf:
        raise UsageError("--tolerance", args.tolerance, "negative or not finite", "a finite number >= 0")
    if args.batch_size < 1 or args.max_batches < 0:
        raise UsageError(
            "--batch-size/--max-batches",
            (args.batch_size, args.max_batches),
            "out of range",
            "batch size >= 1, max batches >= 0",
        )
    device = torch.device(resolve_device(args.device, DEVICES))
    if args.verdict_prefix and not args.run_id:
        raise UsageError("--verdict-prefix", args.verdict_prefix, "needs a run id", "--run-id or env RUN_ID")
    return device, args.verdict or (
        under_prefix(args.verdict_prefix, args.run_id, "verdict.json") if args.verdict_prefix else ""
    )


def _validate(args: argparse.Namespace, device: torch.device, verdict_at: str) -> dict:
    """The verdict document for the checkpoint and data the flags name."""
    root = Path(checkpoint_dir(args, "--checkpoint")).resolve()
    metric, (measured, path, meta, extra) = workloads.evaluate(root, args, device)
    trained = meta.get("config", {}).get("train", {}).get("model")
    if args.model and trained and args.model != trained:
        raise UsageError("--model", args.model, f"the checkpoint {path} holds model {trained!r}", trained)
    value: float | None = measured
    if not math.isfinite(measured):
        log(f"validate: WARNING {metric} of {path} is {measured}: the model diverged; rejecting it")
        value = None
    record = {"metric": metric, "value": value, "checkpoint": str(path), "step": meta["step"], **extra}
    if metric == METRIC:
        record["perplexity"] = perplexity(value)
    base, baseline_location, created = resolve_baseline(args.baseline, record, verdict_at)
    return {
        **verdict(value, base, args.tolerance, metric),
        "checkpoint": str(path),
        "step": meta["step"],
        **extra,
        "baseline_location": baseline_location,
        "baseline_created": created,
    }


if __name__ == "__main__":
    sys.exit(main())

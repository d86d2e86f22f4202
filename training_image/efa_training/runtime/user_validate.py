"""A declared workload's validation: its `validate` command, then the gate over the metrics file it wrote.

    WORKLOAD=<declaration> python -m efa_training.runtime.user_validate --run-id run-7 --baseline 3.2 \\
        --tolerance 0.001 --verdict-prefix s3://<data bucket>/runs/   [--data ... --checkpoint-dir ... --run-dir ...]
        [--model-archive <folder or .tar.gz>]

The command runs with the contract's environment (user_workload.prepare_run) and must write MODEL_DIR/metrics.json
holding the declared metric; a metrics file already there is removed first, so the gate judges only this one's.
--model-archive (SageMaker: the `model` channel) unpacks the training job's model.tar.gz into MODEL_DIR first, where
the FSx backends share the training's MODEL_DIR itself (launch/sagemaker.py unpack_model_archive). The
verdict ({"metric","direction","value","baseline","delta","relative_delta","tolerance","passed"}) goes where the
built-in validation writes it, so the pipeline reads it the same way.
Exit codes: the command's own when it fails (2: its input is wrong); 2 for bad flags or no metrics file; 0 for
accept and reject alike (the pipeline branches on `passed`).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from efa_training.runtime import tracking
from efa_training.runtime.errors import UsageError, exit_with_usage_error
from efa_training.runtime.launch.sagemaker import unpack_model_archive
from efa_training.runtime.run_paths import flag_value
from efa_training.runtime.storage import under_prefix, write_json
from efa_training.runtime.user_workload import METRICS_FILE, gate, prepare_run

DEFAULT_TOLERANCE = 0.001  # the run contract's (contracts/run.py): within 0.1% of the baseline


def _number(flag: str, text: str, default: float | None) -> float | None:
    """A finite number; empty or 'none' gives `default`."""
    if text.strip().lower() in ("", "none"):
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise UsageError(flag, text, "not a finite number", "a number, or none")
    return value


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        workload, run_id, contract = prepare_run(argv, os.environ)
        baseline = _number("--baseline", flag_value(argv, "--baseline") or os.environ.get("BASELINE_URI", ""), None)
        tolerance = _number("--tolerance", flag_value(argv, "--tolerance") or "", DEFAULT_TOLERANCE)
        if tolerance is None or tolerance < 0:
            raise UsageError("--tolerance", tolerance, "negative", "a number >= 0")
        prefix = flag_value(argv, "--verdict-prefix") or os.environ.get("VERDICT_PREFIX", "")
        verdict_at = flag_value(argv, "--verdict") or (under_prefix(prefix, run_id, "verdict.json") if prefix else "")
        archive = flag_value(argv, "--model-archive")
        if archive:  # before the stale metrics file goes: training's own metrics.json travels in the archive
            unpack_model_archive(Path(archive), Path(contract["MODEL_DIR"]))
    except UsageError as err:
        exit_with_usage_error("validate", err)
    # Only this validation's file may be judged: one left by an earlier run or attempt (or by the training) would
    # pass a model whose own validation wrote nothing, or wrote its NaN elsewhere.
    (Path(contract["MODEL_DIR"]) / METRICS_FILE).unlink(missing_ok=True)
    code = subprocess.run(list(workload.validate), env={**os.environ, **contract}).returncode
    if code != 0:
        return code if code > 0 else 128 - code
    try:
        result = gate(workload, Path(contract["MODEL_DIR"]), baseline, tolerance)
    except UsageError as err:
        exit_with_usage_error("validate", err)
    if verdict_at:
        write_json(verdict_at, result)
    print(json.dumps({"verdict": result}, allow_nan=False), flush=True)
    tracking.record_verdict(os.environ, run_id, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

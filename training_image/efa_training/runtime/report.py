"""For your own training code (docs/workloads.md): report metrics without declaring a regular expression.

    from efa_training.runtime.report import report_metrics   # in the platform's image, under its launcher
    report_metrics(step=100, loss=2.31, tokens_per_s=51234.0)

Prints one line, `efa-training-metrics {"step": 100, "loss": 2.31, "tokens_per_s": 51234.0}`, which the launcher
reads on the main node into the same CloudWatch metrics as a declared regex's match (namespace EfaTraining,
dimensions Environment and RunId): call it from one rank (rank 0) per step you report. Standard library only.
"""

from __future__ import annotations

import json
import math
import sys

PREFIX = "efa-training-metrics "  # runtime/workload_metrics.py LogMetrics reads lines that start with it
NAME_CHARACTERS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-")


def report_metrics(**values: float) -> None:
    """One line of metrics, name -> number; a name must be 1-64 letters, digits, '_', '.', ':' or '-'. NaN and
    infinities are left out (CloudWatch drops a record that holds one); nothing is printed when none is left."""
    kept = {}
    for name, value in values.items():
        if not (0 < len(name) <= 64 and set(name) <= NAME_CHARACTERS):
            raise ValueError(f"report_metrics: metric name {name!r} is not valid; expected 1-64 letters, digits, _.:-")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"report_metrics: {name}={value!r} is not a number")
        if math.isfinite(value):
            kept[name] = float(value)
    if kept:
        sys.stdout.write(PREFIX + json.dumps(kept) + "\n")
        sys.stdout.flush()

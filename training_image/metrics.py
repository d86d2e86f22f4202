"""Per-step metrics as CloudWatch Embedded Metric Format (EMF) JSON lines on stdout.

The CloudWatch agent / Fluent Bit (EKS) or the awslogs driver (Batch) ships
stdout to CloudWatch Logs; EMF lines there become metrics without any API
call from the training job. Names are a contract with the dashboards:
Loss, TokensPerSecond, StepTimeSeconds, MFU in namespace EfaTraining with
dimension RunId.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import TextIO

NAMESPACE = "EfaTraining"
UNITS = {"Loss": "None", "TokensPerSecond": "Count/Second", "StepTimeSeconds": "Seconds", "MFU": "Percent",
         "NonFiniteLoss": "Count"}

# Dense bf16 peak TFLOPS per accelerator, by device-name substring (vendor data sheets).
# PEAK_TFLOPS_PER_ACCELERATOR overrides it for devices not listed here.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 70.0, "L4": 121.0}


def peak_tflops(device_name: str) -> float | None:
    override = os.environ.get("PEAK_TFLOPS_PER_ACCELERATOR")
    if override:
        return float(override)
    for key, value in PEAK_BF16_TFLOPS.items():
        if key in device_name:
            return value
    return None


def emf_record(run_id: str, step: int, values: dict[str, float], timestamp_ms: int | None = None) -> dict:
    """One EMF document: metrics declared under _aws, values and dimensions at top level."""
    names = [n for n in values if n in UNITS]
    return {
        "_aws": {
            "Timestamp": timestamp_ms if timestamp_ms is not None else int(time.time() * 1000),
            "CloudWatchMetrics": [{
                "Namespace": NAMESPACE,
                "Dimensions": [["RunId"]],
                "Metrics": [{"Name": n, "Unit": UNITS[n]} for n in names],
            }],
        },
        "RunId": run_id,
        "Step": step,  # a property, not a dimension: one metric stream per run, not per step
        **values,
    }


class MetricsLogger:
    def __init__(self, run_id: str, enabled: bool, stream: TextIO = sys.stdout) -> None:
        self.run_id, self.enabled, self.stream = run_id, enabled, stream

    def step(self, step: int, loss: float, tokens_per_s: float, step_time_s: float,
             mfu_percent: float | None = None, **extra: float) -> None:
        if not self.enabled:
            return
        # NaN/inf is not valid JSON, and CloudWatch would drop the whole line: a diverged run reports
        # NonFiniteLoss=1 (which the NonFiniteLoss alarm watches) and leaves Loss out of that line.
        finite = math.isfinite(loss)
        values = {"NonFiniteLoss": 0 if finite else 1, "TokensPerSecond": tokens_per_s, "StepTimeSeconds": step_time_s}
        if finite:
            values["Loss"] = loss
        if mfu_percent is not None:
            values["MFU"] = mfu_percent
        values.update(extra)
        self.stream.write(json.dumps(emf_record(self.run_id, step, values)) + "\n")
        self.stream.flush()

    def summary(self, summary: dict) -> None:
        if self.enabled:
            # Strict JSON: a NaN/Infinity anywhere (a diverged run) becomes null instead of a line
            # that JSON parsers and CloudWatch reject.
            self.stream.write(json.dumps({"summary": finite_or_none(summary)}, allow_nan=False) + "\n")
            self.stream.flush()


def finite_or_none(obj):
    """`obj` with every non-finite float replaced by None (recursively through dicts and lists)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj


def parse_emf_lines(lines) -> list[dict]:
    """Read back EMF records (for local_run's plot and the tests)."""
    out = []
    for line in lines:
        line = line.strip()
        if line.startswith("{") and '"_aws"' in line:
            out.append(json.loads(line))
    return out

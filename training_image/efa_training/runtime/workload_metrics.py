"""A declared workload's metrics (docs/workloads.md), read from the lines its code prints: each line a declared regex
matches, and each `efa-training-metrics` line of efa_training.runtime.report, becomes one line of CloudWatch's embedded
metric format with the step it belongs to, which the run's tracker logs each value at (runtime/tracking.py).

The step: a `report_metrics(step=N)` line's own; for a regex's value, the regex's `step` group where it names one
(`(?P<step>\\d+)`), else the line's `step=N`. Without any, the tracker logs the value at step 0. Standard library only.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from efa_training.runtime.metrics import NAMESPACE, PROGRESS_METRIC
from efa_training.runtime.report import PREFIX as REPORT_PREFIX

if TYPE_CHECKING:
    from efa_training.runtime.user_workload import UserWorkload

# A declared regex may name its step, (?P<step>\d+): contracts/workload.py STEP_GROUP (a test holds them equal).
STEP_GROUP = "step"
STEP_IN_LINE = re.compile(r"(?<![\w.-])step=(\d+)\b")  # else the line's own `step=N`


class LogMetrics:
    """Each log line the declared regexes match becomes one EMF line (namespace EfaTraining, dimensions Environment
    and RunId, as the built-in workloads' metrics): the same CloudWatch metrics from any code that prints them."""

    def __init__(
        self, workload: UserWorkload, run_id: str, environment: str = "", emit: Callable[[str], None] = print
    ) -> None:
        self.patterns, self.run_id, self.environment, self.emit = workload.metrics, run_id, environment, emit

    def feed(self, line: str) -> dict[str, float]:
        """The line's metric values, emitted as one EMF line at the line's step (`step_of`); {} when none."""
        step, values = self._reported(line)
        for name, pattern in self.patterns.items():
            found, group = pattern.search(line), _value_group(pattern)
            value = _finite(found.group(group)) if found and group else None
            if found and value is not None:
                values[name] = value
                step = step if step is not None else step_of(found, line)
        if values:
            self.emit(json.dumps(self._record(values, step)))
        return values

    @staticmethod
    def _reported(line: str) -> tuple[int | None, dict[str, float]]:
        """A line from efa_training.runtime.report.report_metrics: its step and its other numbers, whatever the
        declaration's regexes."""
        if not line.startswith(REPORT_PREFIX):
            return None, {}
        try:
            reported = json.loads(line[len(REPORT_PREFIX) :])
        except ValueError:
            return None, {}
        if not isinstance(reported, dict):
            return None, {}
        numbers = {k: float(v) for k, v in reported.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        step = numbers.pop(STEP_GROUP, math.nan)
        values = {k: v for k, v in numbers.items() if isinstance(k, str) and math.isfinite(v)}
        return (int(step) if step.is_integer() and step >= 0 else None), values  # a whole step only

    def _record(self, values: dict[str, float], step: int | None = None) -> dict:
        """The EMF document of one line's values, with ProgressLines 1 (metrics.py UNITS: the NoProgress alarm's) and
        the step as a property, as the built-in trainers' (metrics.py emf_record): the tracker logs each value at it."""
        values = {**values, PROGRESS_METRIC: 1.0}
        dimensions = ["Environment", "RunId"] if self.environment else ["RunId"]
        metadata = {
            "Timestamp": int(time.time() * 1000),
            "CloudWatchMetrics": [
                {"Namespace": NAMESPACE, "Dimensions": [dimensions], "Metrics": [{"Name": n} for n in values]}
            ],
        }
        scope = {"Environment": self.environment} if self.environment else {}
        at = {"Step": step} if step is not None else {}
        return {"_aws": metadata, **scope, "RunId": self.run_id, **at, **values}


def _value_group(pattern: re.Pattern) -> int | None:
    """The group that holds a declared regex's value: its one group other than `step` (contracts/workload.py)."""
    step = pattern.groupindex.get(STEP_GROUP)
    return next((i for i in range(1, pattern.groups + 1) if i != step), None)


def _finite(text: str | None) -> float | None:
    try:
        value = float(text or "")
    except ValueError:
        return None
    return value if math.isfinite(value) else None  # NaN/Infinity are not JSON: CloudWatch would drop the whole line


def step_of(found: re.Match, line: str) -> int | None:
    """The step a regex's value belongs to: the regex's own `step` group where it names one, else the line's
    `step=N`; None where neither says (the tracker then logs it at step 0)."""
    text = found.groupdict().get(STEP_GROUP) if STEP_GROUP in found.re.groupindex else None
    if text is None:
        in_line = STEP_IN_LINE.search(line)
        text = in_line.group(1) if in_line else None
    return int(text) if text is not None and text.isdigit() else None

"""A workload's cost model: what a run's quote needs to turn its hyperparameters into training hours.

A declaration may say (`cost`) which hyperparameter counts the optimizer steps, which the samples each worker takes
per step, and the training TFLOPs of one sample, either one number or one per value of a string hyperparameter with
choices (the built-in GPT trainer's per model size), and optionally (`split_by`) the integer hyperparameter, or the
list of them, over whose product of workers one sample's work is split (tensor- and pipeline-parallel degrees: each of
them computes 1/N of it, and the batch is taken once per group of N), and optionally (`pipeline_stages`) the integer
hyperparameter of pipeline stages, whose schedule idles (P-1)/(m+P-1) of each step (1F1B's bubble, m microbatches:
the fewest equal parts of the batch that are at least P, as the built-in GPT trainer cuts it;
sizes.pipeline_microbatches). contracts/quote.py prices a run as
    seconds per step = batch_size x TFLOPs per sample / (split x peak TFLOP/s per worker x MFU) x (m+P-1)/m
and the quote's measured MFU may be that of earlier runs of the same value (the image's MFU metric by `Model`).
A workload that declares none is run unquoted: the quote says there is no FLOPs model for it.

    "cost": {"steps": "max_steps", "batch_size": "batch_size",
             "tflops_per_sample": {"by": "model", "values": {"small": 0.64, "large": 2.17}},
             "split_by": ["tensor_parallel", "pipeline_parallel"], "pipeline_stages": "pipeline_parallel"}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from contracts.run import Field

KEYS = ("steps", "batch_size", "tflops_per_sample")
OPTIONAL_KEYS = ("split_by", "pipeline_stages")
SHAPE = (
    '{"steps": <integer hyperparameter>, "batch_size": <integer hyperparameter>, "tflops_per_sample": <number> or '
    '{"by": <string hyperparameter with choices>, "values": {<choice>: <number>, ...}}, optional "split_by": '
    '<integer hyperparameter, at least 1, or a list of them>, optional "pipeline_stages": <integer hyperparameter, '
    "at least 1>}"
)


@dataclass(frozen=True)
class CostModel:
    steps: str  # the hyperparameter that counts optimizer steps
    batch_size: str  # the hyperparameter of samples per worker per step
    tflops: float | None = None  # training TFLOPs of one sample, where it is one number
    by: str | None = None  # else the string hyperparameter whose value picks it from `values`
    values: Mapping[str, float] | None = None
    split_by: tuple[str, ...] = ()  # the hyperparameters whose product of workers share one sample's work
    pipeline_stages: str | None = None  # the hyperparameter of pipeline stages, whose bubble lengthens each step

    def split(self, hyperparameters: Mapping[str, object]) -> int:
        """How many workers share one sample's FLOPs (1 without `split_by`)."""
        values = [hyperparameters.get(name) for name in self.split_by]
        return math.prod(v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else 1 for v in values)

    def bubble(self, hyperparameters: Mapping[str, object]) -> float:
        """How much longer a step takes for the pipeline's bubble: (m+P-1)/m (1 without `pipeline_stages`)."""
        stages, batch = (hyperparameters.get(k) if k else None for k in (self.pipeline_stages, self.batch_size))
        if not isinstance(stages, int) or not isinstance(batch, int) or stages <= 1:
            return 1.0
        microbatches = next((m for m in range(stages, batch + 1) if batch % m == 0), batch)
        return (microbatches + stages - 1) / microbatches

    def sample_tflops(self, hyperparameters: Mapping[str, object]) -> float | None:
        if self.by is None:
            return self.tflops
        value = hyperparameters.get(self.by)
        return self.values.get(value) if self.values is not None and isinstance(value, str) else None

    def size(self, hyperparameters: Mapping[str, object]) -> str | None:
        """The run's value of `by` (one of its declared choices), whose own measured MFU the quote prefers."""
        value = hyperparameters.get(self.by) if self.by else None
        return value if isinstance(value, str) and self.values is not None and value in self.values else None

    def as_json(self) -> dict:
        """What the pipeline's QuoteRun state reads (constructs/pipeline/run_quote.py)."""
        per_sample = {"by": self.by, "values": dict(self.values or {})} if self.by else self.tflops
        return {
            "steps": self.steps,
            "batch_size": self.batch_size,
            "tflops_per_sample": per_sample,
            "split_by": list(self.split_by),
            "pipeline_stages": self.pipeline_stages,
        }


def parse_cost(
    bad: Callable[[str, object, str], Exception], raw: object, fields: tuple[Field, ...]
) -> CostModel | None:
    """The declaration's `cost`, checked against its hyperparameters; `bad(field, value, allowed)` makes the error."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not set(KEYS) <= set(raw) <= set(KEYS + OPTIONAL_KEYS):
        raise bad("cost", raw, SHAPE)
    kinds = {f.key: f for f in fields}
    given = raw.get("split_by", [])
    split_by = tuple([given] if isinstance(given, str) else given if isinstance(given, list) else [None])
    splitting = [kinds.get(name) if isinstance(name, str) else None for name in split_by]
    if not all(f is not None and f.kind == "integer" and (f.minimum or 0) >= 1 for f in splitting):
        raise bad(
            "cost.split_by",
            given,
            "the name of one of its integer hyperparameters whose minimum is at least 1, or a list of them",
        )
    stages = raw.get("pipeline_stages")
    staged = kinds.get(stages) if isinstance(stages, str) else None
    if "pipeline_stages" in raw and (staged is None or staged.kind != "integer" or (staged.minimum or 0) < 1):
        raise bad(
            "cost.pipeline_stages", stages, "the name of one of its integer hyperparameters whose minimum is at least 1"
        )
    for key in ("steps", "batch_size"):
        named = kinds.get(raw[key]) if isinstance(raw[key], str) else None
        if named is None or named.kind != "integer":
            raise bad(f"cost.{key}", raw[key], "the name of one of its integer hyperparameters")
    per_sample = raw["tflops_per_sample"]
    if not isinstance(per_sample, dict):
        if not _positive(per_sample):
            raise bad("cost.tflops_per_sample", per_sample, "a positive finite number, or " + SHAPE)
        return CostModel(
            raw["steps"], raw["batch_size"], tflops=float(per_sample), split_by=split_by, pipeline_stages=stages
        )
    by, values = per_sample.get("by"), per_sample.get("values")
    picked = kinds.get(by) if isinstance(by, str) else None
    if set(per_sample) != {"by", "values"} or picked is None or not picked.choices:
        raise bad("cost.tflops_per_sample.by", by, "the name of one of its string hyperparameters with choices")
    if not isinstance(values, dict) or set(values) != set(picked.choices) or not all(map(_positive, values.values())):
        raise bad(
            "cost.tflops_per_sample.values", values, f"a positive finite number for each of {', '.join(picked.choices)}"
        )
    return CostModel(
        raw["steps"],
        raw["batch_size"],
        by=by,
        values={k: float(v) for k, v in values.items()},
        split_by=split_by,
        pipeline_stages=stages,
    )


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0

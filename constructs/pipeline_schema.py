"""The training pipeline's execution input: fields, defaults and limits, in one place.

Pure Python on purpose: the state machine renders its ASL checks from these tables and the
operator CLI validates a run file with `validate_run` before starting an execution, so the two
can never disagree. (The CLI loads this file directly: importing the `constructs` package
would start jsii's Node.js process.)
"""

from dataclasses import dataclass

# Top-level fields. None means required: the state machine merges these defaults under the
# input, so a required field still null after the merge was missing.
RUN_FIELDS: dict[str, object] = {
    "run_id": None,
    "dataset": None,
    "nodes": None,  # default: the environment's maximum (filled in by `run_defaults`)
    "hyperparameters": {},
    "baseline": None,
    "tolerance": 0.001,  # 0.1%: the seeds accept a model only within 0.1% of the baseline
    "max_attempts": 2,
}
# Defaults match training_image/train.py's TrainConfig, so a run file may omit any of them.
HYPERPARAMETERS: dict[str, object] = {
    "model": "tiny",
    "max_steps": 1000,
    "checkpoint_every": 250,
    "seed": 1337,
    "strategy": "ddp",
    "lr": 3e-4,
    "batch_size": 8,
}
STRATEGIES = ("ddp", "fsdp")
DATASET_PREFIX = "datasets/"  # config.layout.DATASETS_PREFIX: datasets live under it in the data bucket
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$"  # Batch job names and S3 keys are built from it
TOLERANCE_RANGE = (0.0, 1.0)  # relative: |value - baseline| / |baseline|
# Batch's own attempts per training submission (SubmitJob RetryStrategy.Attempts allows 1-10).
MAX_ATTEMPTS_RANGE = (1, 10)


@dataclass(frozen=True)
class NumberRule:
    """A numeric field's limits; `integer` fields must be whole numbers."""
    field: str
    minimum: float
    maximum: float | None = None
    integer: bool = True
    exclusive_minimum: bool = False


def run_defaults(max_nodes: int) -> dict[str, object]:
    return {**RUN_FIELDS, "nodes": max_nodes}


def fixed_nodes_message(nodes: int) -> str:
    return (f"nodes must be {nodes} on this backend: its multi-node job definitions fix the node count "
            "(a smaller run would boot every host and then fail)")


def number_rules(max_nodes: int, min_nodes: int = 1) -> tuple[NumberRule, ...]:
    """Every numeric field with its limits; `hyperparameters.x` for nested ones."""
    return (
        NumberRule("nodes", min_nodes, max_nodes),
        NumberRule("baseline", float("-inf"), integer=False),
        NumberRule("tolerance", TOLERANCE_RANGE[0], TOLERANCE_RANGE[1], integer=False),
        NumberRule("max_attempts", *MAX_ATTEMPTS_RANGE),
        NumberRule("hyperparameters.max_steps", 1),
        NumberRule("hyperparameters.checkpoint_every", 1),
        NumberRule("hyperparameters.seed", 0),
        NumberRule("hyperparameters.lr", 0, integer=False, exclusive_minimum=True),
        NumberRule("hyperparameters.batch_size", 1),
    )


def validate_run(run: object, max_nodes: int, min_nodes: int = 1) -> list[str]:
    """Every problem with a run (the state machine checks the same, and stops at the first)."""
    import re

    if not isinstance(run, dict):
        return ["the run must be a JSON object"]
    problems = [f"unknown field {key!r}; expected {', '.join(RUN_FIELDS)}" for key in run if key not in RUN_FIELDS]
    hyper = run.get("hyperparameters", {})
    if not isinstance(hyper, dict):
        problems.append("hyperparameters must be an object")
        hyper = {}
    problems += [f"unknown hyperparameter {key!r}; expected {', '.join(HYPERPARAMETERS)}"
                 for key in hyper if key not in HYPERPARAMETERS]
    for key, default in RUN_FIELDS.items():
        if default is None and key != "nodes" and run.get(key) is None:
            problems.append(f"{key} is missing")
    run_id, dataset = run.get("run_id"), run.get("dataset")
    if run_id is not None and not (isinstance(run_id, str) and re.match(RUN_ID_PATTERN, run_id)):
        problems.append(f"run_id={run_id!r} is not valid; expected 1-63 letters, digits, '-' or '_'")
    if dataset is not None and not (isinstance(dataset, str) and dataset.startswith(DATASET_PREFIX)
                                    and len(dataset) > len(DATASET_PREFIX)):
        problems.append(f"dataset={dataset!r} is not valid; expected a path under {DATASET_PREFIX} "
                        f"in the data bucket, like {DATASET_PREFIX}wikitext/")
    merged = {**run_defaults(max_nodes), **run, "hyperparameters": {**HYPERPARAMETERS, **hyper}}
    for rule in number_rules(max_nodes, min_nodes):
        value = _get(merged, rule.field)
        if value is None and RUN_FIELDS.get(rule.field, 0) is None:
            continue  # already reported as missing
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (rule.integer and value != int(value)):
            expected = "an integer" if rule.integer else "a number"
            problems.append(f"{rule.field}={value!r} is not valid; expected {expected}")
        elif rule.field == "nodes" and value > max_nodes:
            problems.append(f"nodes={value!r} is above this environment's maximum of {max_nodes} nodes")
        elif rule.field == "nodes" and value < min_nodes == max_nodes:
            problems.append(f"nodes={value!r}: {fixed_nodes_message(max_nodes)}")
        elif value < rule.minimum or (rule.exclusive_minimum and value == rule.minimum) or (
                rule.maximum is not None and value > rule.maximum):
            problems.append(f"{rule.field}={value!r} is out of range; expected {_describe(rule)}")
    strategy = merged["hyperparameters"]["strategy"]
    if strategy not in STRATEGIES:
        problems.append(f"hyperparameters.strategy={strategy!r} is not valid; expected {' or '.join(STRATEGIES)}")
    if not isinstance(merged["hyperparameters"]["model"], str):
        problems.append("hyperparameters.model must be a string, like tiny or 125m")
    return problems


def _get(data: dict, dotted: str) -> object:
    for part in dotted.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _describe(rule: NumberRule) -> str:
    low = f"> {rule.minimum:g}" if rule.exclusive_minimum else f">= {rule.minimum:g}"
    return f"{low} and <= {rule.maximum:g}" if rule.maximum is not None else low

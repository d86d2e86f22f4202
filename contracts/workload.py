"""A workload: the user's training code, declared once per environment (cdk.json `workloads`), as the platform runs it.

A declaration names where the image comes from (a folder with a Dockerfile built on the platform's image, or an
image URI), how the code is launched on each node, its train and validate commands, the metric the validation gate
reads (and whether lower or higher is better), the regular expressions that turn its log lines into metrics (as
SageMaker's metric definitions do), and its hyperparameters' schema. docs/workloads.md is the contract the code
follows; this module only reads and checks declarations: every mistake is one line naming the workload, the
field, the value and what is allowed, at synth.

    "workloads": {"my-llm": {"image": {"directory": "my-llm"}, "launch": "torchrun",
                             "train": ["python", "train.py"], "validate": ["python", "evaluate.py"],
                             "metric": {"name": "eval_loss", "direction": "lower"},
                             "metrics": {"loss": "loss=([0-9.eE+-]+)"},
                             "hyperparameters": {"lr": {"type": "number", "default": 0.001, "minimum": 0}}}}
"""

import functools
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from contracts.run import (
    DEFAULT_WORKLOAD,
    REQUIRED,
    WORKLOAD_NAME_PATTERN,
    Field,
    WorkloadSchema,
    WorkloadSchemas,
    check_value,
)
from contracts.workload_cost import CostModel, parse_cost

# Launch modes: the platform's torchrun on every node (its rendezvous; the command is the script and its
# arguments); the workload's own per-node launcher (`accelerate launch`, `deepspeed`), run once per node with the
# same environment; or one process per node (RANK = node rank, WORLD_SIZE = nodes).
LAUNCHES = ("torchrun", "per-node", "one-process")
# The platform's own trainers (the GPT and click-through models) are declared the same way, beside their code
# (training_image/efa_training/workloads/<name>/workload.json), on the platform's image ("image": "platform") and run by
# its launcher itself ("launch": "platform": the hyperparameters become the trainer's flags); only they may say so.
PLATFORM = "platform"
BUILT_IN_ROOT = Path(__file__).resolve().parents[1] / "training_image" / "efa_training" / "workloads"
DIRECTIONS = ("lower", "higher")  # which way the validation metric is better
HYPERPARAMETER_TYPES = ("string", "integer", "number", "boolean")
# A metric regex may name the step its value belongs to, `(?P<step>\d+)`; else the line's `step=N` is it (the
# image's runtime/workload_metrics.py STEP_GROUP, tested equal).
STEP_GROUP = "step"
# How the code receives a run's hyperparameters: always as HYPERPARAMETERS_FILE and HP_<NAME> variables; with
# "flags" also as `--<name> <value>` after the train command, as SageMaker passes them to a script's entry point
# (SageMaker developer guide, "Adapting your own training container": hyperparameters "as command-line arguments").
HYPERPARAMETERS_AS = ("file", "flags")
LAYOUTS = ("node", "run")  # a degree of parallelism inside one node, or over the whole run (contracts.run.Field)
# The Dockerfile of a workload built from a folder starts from the platform's image, which carries the launcher,
# the sanity check and the EFA stack: `make push-workload` passes its local tag as this build argument.
PLATFORM_IMAGE_ARG = "PLATFORM_IMAGE"
# Names reach Batch job definition names, Kubernetes labels and SageMaker job names: short, lower case.
NAME_PATTERN = WORKLOAD_NAME_PATTERN
HYPERPARAMETER_NAME_PATTERN = r"[a-z_][a-z0-9_]{0,63}"
METRIC_NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_.:-]{0,63}"
IMAGE_URI_PATTERN = r"[a-z0-9.-]+(?::[0-9]+)?/[a-z0-9._/-]+(?::[A-Za-z0-9_.-]{1,128}|@sha256:[0-9a-f]{64})"
MAX_COMMAND_ITEMS, MAX_HYPERPARAMETERS, MAX_METRICS = 64, 100, 40
FIELDS = (
    "image",
    "launch",
    "train",
    "validate",
    "metric",
    "metrics",
    "hyperparameters",
    "hang_timeout_seconds",
    "cost",
    "hyperparameters_as",
)
# The hang watchdog's floor (training_image/efa_training/runtime/launch/watchdog.py): a training with no progress line
# for this long (or 10 times its usual interval, if longer) is ended. Long enough for the slowest checkpoint save.
HANG_TIMEOUT_DEFAULT, HANG_TIMEOUT_RANGE = 1800, (60, 7 * 24 * 3600)


class WorkloadError(ValueError):
    """One line: `workloads.<name>.<field>=<value> is not valid; expected <what is allowed>`."""


@dataclass(frozen=True)
class Workload:
    name: str
    image_directory: str | None  # a folder (relative to the project) with a Dockerfile on the platform's image
    image_uri: str | None
    launch: str
    train: tuple[str, ...]
    validate: tuple[str, ...]
    metric: str
    direction: str
    metrics: Mapping[str, str]  # metric name -> regex with one group, matched on every log line
    hyperparameters: tuple[Field, ...]  # dotted names: hyperparameters.<name>
    hang_timeout_seconds: int = HANG_TIMEOUT_DEFAULT
    cost: CostModel | None = None  # what a run's quote prices (contracts/quote.py); None: no estimate
    hyperparameters_as: str = HYPERPARAMETERS_AS[0]

    @property
    def platform(self) -> bool:
        """One of the platform's own trainers: its image, run by its launcher with the hyperparameters as flags."""
        return self.launch == PLATFORM

    @property
    def variable(self) -> str:
        """The job's WORKLOAD environment variable: the declaration as compact JSON."""
        return json.dumps(self.as_json(), separators=(",", ":"))

    def as_json(self) -> dict:
        """What the launcher in the image reads (the job's WORKLOAD environment variable, as JSON)."""
        return {
            "name": self.name,
            "launch": self.launch,
            "train": list(self.train),
            "validate": list(self.validate),
            "metric": {"name": self.metric, "direction": self.direction},
            "metrics": dict(self.metrics),
            "hang_timeout_seconds": self.hang_timeout_seconds,
            "hyperparameters_as": self.hyperparameters_as,
        }


def parse_workloads(raw: object, root: Path) -> tuple[Workload, ...]:
    """Every declared workload, checked; `root` is where image folders are found (the project). `raw` is one
    environment's `workloads` as cdk.json writes it (an object) or as `-c workloads=...` passes it (its JSON text)."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            raise WorkloadError(f"workloads={_show(raw)} is not valid; expected a JSON object") from None
    if not isinstance(raw, dict):
        raise WorkloadError(f"workloads={_show(raw)} is not valid; expected an object of workload name -> declaration")
    return tuple(parse_workload(name, declaration, root) for name, declaration in raw.items())


def schemas(workloads: tuple[Workload, ...]) -> WorkloadSchemas:
    """Each workload's schema by its name (its hyperparameter fields, whether it takes an initial model, its cost
    model): what the run contract checks a run's against and the quote prices. The built-in ones always come too."""
    return {w.name: WorkloadSchema(w.hyperparameters, w.platform, w.cost) for w in (*built_in_workloads(), *workloads)}


@functools.cache
def built_in_workloads() -> tuple[Workload, ...]:
    """The platform's own trainers, read from their declarations (named after their folder, '_' as '-'), the default
    workload first."""
    found = {path.parent.name.replace("_", "-"): path for path in BUILT_IN_ROOT.glob("*/workload.json")}
    names = sorted(found, key=lambda name: (name != DEFAULT_WORKLOAD, name))
    return tuple(parse_workload(n, json.loads(found[n].read_text()), BUILT_IN_ROOT, built_in=True) for n in names)


def parse_workload(name: object, raw: object, root: Path, built_in: bool = False) -> Workload:
    """One declaration, checked; `built_in`: one of the platform's own (training_image/.../workload.json)."""
    taken = () if built_in else tuple(w.name for w in built_in_workloads())
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name) or name in taken:
        raise WorkloadError(
            f"workloads.{name}: the name is not valid; expected 1-24 lower-case letters, digits and '-', "
            f"starting with a letter and ending with a letter or digit, other than {' and '.join(taken)} (the "
            "platform's own trainers)"
        )
    where = _Where(name)
    if not isinstance(raw, dict):
        raise where.bad("", raw, "an object with " + ", ".join(FIELDS))
    for key in raw:
        if key not in FIELDS:
            raise where.bad(key, raw[key], f"no such field; a declaration has only {', '.join(FIELDS)}")
    directory, uri = _image(where, raw.get("image"), root, built_in)
    hyperparameters = _schema(where, raw.get("hyperparameters", {}))
    metric = raw.get("metric")
    if not isinstance(metric, dict) or set(metric) != {"name", "direction"}:
        raise where.bad("metric", metric, 'an object {"name": <metric>, "direction": "lower" or "higher"}')
    return Workload(
        name=name,
        image_directory=directory,
        image_uri=uri,
        launch=where.choice("launch", raw.get("launch", "torchrun"), (*LAUNCHES, *([PLATFORM] if built_in else []))),
        train=_command(where, "train", raw.get("train")),
        validate=_command(where, "validate", raw.get("validate")),
        metric=where.matching("metric.name", metric["name"], METRIC_NAME_PATTERN, "a metric name"),
        direction=where.choice("metric.direction", metric["direction"], DIRECTIONS),
        metrics=_regexes(where, raw.get("metrics", {})),
        hyperparameters=hyperparameters,
        hang_timeout_seconds=_hang_timeout(where, raw.get("hang_timeout_seconds", HANG_TIMEOUT_DEFAULT)),
        cost=parse_cost(where.bad, raw.get("cost"), hyperparameters),
        hyperparameters_as=where.choice(
            "hyperparameters_as", raw.get("hyperparameters_as", "file"), HYPERPARAMETERS_AS
        ),
    )


def _hang_timeout(where: "_Where", raw: object) -> int:
    low, high = HANG_TIMEOUT_RANGE
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
        raise where.bad("hang_timeout_seconds", raw, f"an integer from {low} to {high} (seconds)")
    return raw


@dataclass(frozen=True)
class _Where:
    name: str

    def bad(self, field: str, value: object, allowed: str) -> WorkloadError:
        path = f"workloads.{self.name}" + (f".{field}" if field else "")
        return WorkloadError(f"{path}={_show(value)} is not valid; expected {allowed}")

    def choice(self, field: str, value: object, choices: tuple[str, ...]) -> str:
        if value not in choices:
            raise self.bad(field, value, " or ".join(choices))
        return str(value)

    def matching(self, field: str, value: object, pattern: str, what: str) -> str:
        if not isinstance(value, str) or not re.fullmatch(pattern, value):
            raise self.bad(field, value, f"{what} matching {pattern}")
        return value


def _image(where: _Where, raw: object, root: Path, built_in: bool) -> tuple[str | None, str | None]:
    """Exactly one of {"directory": ...} (built on the platform's image) or {"uri": ...} (documented, unchecked);
    for a built-in trainer, "platform" (neither)."""
    if built_in and raw == PLATFORM:
        return None, None
    allowed = '{"directory": <folder with a Dockerfile>} or {"uri": <image URI>}'
    if not isinstance(raw, dict) or len(raw) != 1 or not set(raw) <= {"directory", "uri"}:
        raise where.bad("image", raw, allowed)
    if "uri" in raw:
        return None, where.matching("image.uri", raw["uri"], IMAGE_URI_PATTERN, "an image URI with a tag or digest")
    directory = raw["directory"]
    dockerfile = root / str(directory) / "Dockerfile"
    if not isinstance(directory, str) or ".." in Path(directory).parts or not dockerfile.is_file():
        raise where.bad("image.directory", directory, "a folder of this project (no '..') holding a Dockerfile")
    if not _builds_on_platform(dockerfile.read_text()):
        raise where.bad(
            "image.directory",
            directory,
            f"a Dockerfile whose first stage is `ARG {PLATFORM_IMAGE_ARG}` then `FROM ${{{PLATFORM_IMAGE_ARG}}}` "
            "(the platform's image carries the launcher, the sanity check and the EFA stack)",
        )
    return directory, None


def _builds_on_platform(dockerfile: str) -> bool:
    """The first FROM is the platform's image, given as the build argument (after its ARG)."""
    lines = [line.strip() for line in dockerfile.splitlines() if line.strip() and not line.strip().startswith("#")]
    first_from = next((i for i, line in enumerate(lines) if line.upper().startswith("FROM ")), None)
    if first_from is None:
        return False
    declared = any(re.fullmatch(rf"ARG\s+{PLATFORM_IMAGE_ARG}(=\S*)?", line, re.I) for line in lines[:first_from])
    image = lines[first_from].split()[1]
    return declared and image in (f"${PLATFORM_IMAGE_ARG}", f"${{{PLATFORM_IMAGE_ARG}}}")


def _command(where: _Where, field: str, raw: object) -> tuple[str, ...]:
    ok = (
        isinstance(raw, list)
        and 0 < len(raw) <= MAX_COMMAND_ITEMS
        and all(isinstance(item, str) and 0 < len(item) <= 1024 for item in raw)
    )
    if not ok:
        raise where.bad(
            field, raw, f'a command as a list of 1-{MAX_COMMAND_ITEMS} strings, like ["python", "train.py"]'
        )
    return tuple(raw)  # type: ignore[arg-type]


def _regexes(where: _Where, raw: object) -> dict[str, str]:
    """Metric name -> a regular expression with exactly one group: the value, read from any log line; and optionally
    a group named `step` (STEP_GROUP), the step the value belongs to."""
    if not isinstance(raw, dict) or len(raw) > MAX_METRICS:
        raise where.bad("metrics", raw, f"an object of at most {MAX_METRICS} metric name -> regular expression")
    for name, regex in raw.items():
        where.matching(f"metrics.{name}", name, METRIC_NAME_PATTERN, "a metric name")
        try:
            compiled = re.compile(regex) if isinstance(regex, str) else None
        except re.error:
            compiled = None
        values = compiled.groups - (STEP_GROUP in compiled.groupindex) if compiled is not None else -1
        if values != 1:
            allowed = f"a regular expression with exactly one group (the value), and optionally (?P<{STEP_GROUP}>...)"
            raise where.bad(f"metrics.{name}", regex, allowed)
    return dict(raw)


def _schema(where: _Where, raw: object) -> tuple[Field, ...]:
    if not isinstance(raw, dict) or len(raw) > MAX_HYPERPARAMETERS:
        raise where.bad("hyperparameters", raw, f"an object of at most {MAX_HYPERPARAMETERS} name -> declaration")
    declared = tuple(_hyperparameter(where, name, spec) for name, spec in raw.items())
    return tuple(_related(where, f, raw[f.key], {g.key: g for g in declared}) for f in declared)


def _hyperparameter(where: _Where, name: object, spec: object) -> Field:
    field = f"hyperparameters.{name}"
    where.matching(field, name, HYPERPARAMETER_NAME_PATTERN, "a name of lower-case letters, digits and '_'")
    keys = {
        *("type", "default", "minimum", "maximum", "exclusive_minimum", "choices", "rule"),
        *("requires", "divides", "layout"),
    }
    if not isinstance(spec, dict) or not set(spec) <= keys or spec.get("type") not in HYPERPARAMETER_TYPES:
        raise where.bad(
            field,
            spec,
            f'{{"type": {" or ".join(HYPERPARAMETER_TYPES)}, optional {", ".join(sorted(keys - {"type"}))}}}',
        )
    numeric = spec["type"] in ("integer", "number")
    low, high = spec.get("minimum"), spec.get("maximum")
    for bound in (low, high):
        if bound is not None and (not numeric or not _finite(bound)):
            raise where.bad(field, spec, "minimum and maximum only on integer and number hyperparameters, finite")
    if low is not None and high is not None and low > high:
        raise where.bad(field, spec, "a minimum no larger than the maximum")
    choices = spec.get("choices", ())
    if choices and (spec["type"] != "string" or not all(isinstance(c, str) for c in choices)):
        raise where.bad(field, spec, "choices (a list of strings) only on string hyperparameters")
    exclusive, rule = spec.get("exclusive_minimum", False), spec.get("rule", "")
    if not isinstance(exclusive, bool) or (exclusive and low is None):
        raise where.bad(field, spec, "exclusive_minimum true or false, true only with a minimum")
    if not isinstance(rule, str) or len(rule) > 200:
        raise where.bad(field, spec, "a rule: what is allowed, in words, at most 200 characters")
    declared = Field(
        field, spec["type"], spec.get("default", REQUIRED), low, high, exclusive, tuple(choices), rule=rule
    )
    # A default is held to what a run may give (the run contract's own check of one value).
    if not declared.required and check_value(declared, declared.default):
        raise where.bad(f"{field}.default", declared.default, declared.allowed())
    return declared


def _related(where: _Where, f: Field, spec: dict, fields: dict[str, Field]) -> Field:
    """`f` with its relations: "requires" {"other": [its values]} (a value other than the default needs the other to
    be one of them) and, on an integer, "divides" {"by": "other", "values": {each of other's choices: an integer}}
    (the value divides the one the other's value maps to, and so does the default). Both name string hyperparameters
    with choices, and a relation needs a default (what every run may leave out)."""
    field, requires, divides = f"hyperparameters.{f.key}", spec.get("requires", {}), spec.get("divides")
    if (requires or divides is not None) and f.required:
        raise where.bad(f"{field}.default", None, "a default, for a hyperparameter with requires or divides")
    good_requires = isinstance(requires, dict) and all(
        other in fields and fields[other].choices and isinstance(values, list) and values
        and set(values) <= set(fields[other].choices) and other != f.key
        for other, values in requires.items()
    )  # fmt: skip
    if not good_requires:
        raise where.bad(
            f"{field}.requires", requires, "an object: another string hyperparameter -> some of its choices"
        )
    related = replace(
        f,
        requires=tuple((other, tuple(values)) for other, values in requires.items()),
        layout=_layout(where, f, spec.get("layout", "")),
    )
    if divides is None:
        return related
    by = divides.get("by") if isinstance(divides, dict) else None
    table = divides.get("values") if isinstance(divides, dict) else None
    good_divides = (
        f.kind == "integer" and (f.minimum or 0) >= 1 and by in fields and by != f.key and isinstance(table, dict)
        and fields[by].kind == "string" and fields[by].choices and set(table) == set(fields[by].choices)
        and isinstance(f.default, int) and all(_positive_multiple(n, f.default) for n in table.values())
    )  # fmt: skip
    if not good_divides or not isinstance(by, str) or not isinstance(table, dict):
        raise where.bad(
            f"{field}.divides",
            divides,
            '{"by": a string hyperparameter with choices, "values": {each of its choices: a positive integer the '
            "default divides}}, on an integer hyperparameter whose minimum is at least 1",
        )
    return replace(related, divides=(by, tuple(table.items())))


def _layout(where: _Where, f: Field, layout: object) -> str:
    """The declaration's layout: node or run, on an integer hyperparameter with a minimum of at least 1 and a default
    (contracts.run.Field.layout says what each means)."""
    if layout == "":
        return ""
    if layout not in LAYOUTS or f.kind != "integer" or (f.minimum or 0) < 1 or f.required:
        raise where.bad(
            f"hyperparameters.{f.key}.layout",
            layout,
            '"node" or "run", on an integer hyperparameter with a default whose minimum is at least 1',
        )
    return str(layout)


def _positive_multiple(n: object, of: int) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 1 and n % of == 0


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

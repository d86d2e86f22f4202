"""Whole-app synthesis, for the tests that need the whole app: the gates, the environment matrix and the contracts
that span stacks. Every other test builds its construct (or its stack) alone (tests/alone.py).

Each distinct configuration is synthesized once per test run, however many pytest-xdist workers ask for it: the
first writes the cloud assembly into a directory all workers of the run share (pytest-xdist's recipe for session
data: the parent of the worker's base temp, one file lock per entry), the others wait on the lock and read it. The
key is the validated configuration, not the overrides that led to it: `env=dev` and
`compute=batch,instance_type=g5.12xlarge` are one app, synthesized once.
"""

import atexit
import fcntl
import hashlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aws_cdk as cdk
from aws_cdk.assertions import Template

from app import build_app
from config import CATALOGUE, EnvironmentConfig, efa_instance_types, load_config
from config.environment import MAX_NODES

ROOT = Path(__file__).resolve().parent.parent
CDK_JSON_CONTEXT = json.loads((ROOT / "cdk.json").read_text())["context"]
ENVIRONMENTS = tuple(CDK_JSON_CONTEXT["environments"])
BACKENDS = ("batch", "eks", "sagemaker")
_SUMMARY = "units.json"  # written last: its presence says the cloud assembly is complete

_shared: list[Path] = []  # the run's shared directory (conftest sets it; a plain script gets a private one)
_synthesized: dict[str, "Synthesized"] = {}


def share(directory: Path) -> None:
    """Use `directory` (shared by every worker of this test run) for cloud assemblies and gate results."""
    _shared[:] = [directory]


def shared_directory() -> Path:
    if not _shared:  # a plain script's own (a benchmark's): removed when it exits, as pytest removes the run's
        _shared.append(Path(tempfile.mkdtemp(prefix="cdk-test-")))
        atexit.register(shutil.rmtree, _shared[0], ignore_errors=True)
    _shared[0].mkdir(parents=True, exist_ok=True)
    return _shared[0]


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold `<path>.lock` exclusively: one worker at a time creates `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f"{path.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def context(**overrides: object) -> dict:
    """The CDK context of `cdk synth -c FIELD=VALUE ...`: values as strings, so the config's coercion runs too."""
    return {**CDK_JSON_CONTEXT, **{name: str(value) for name, value in overrides.items()}}


# How a type sold only through Capacity Blocks for ML runs on Batch and EKS: in a block (the id is a stand-in) in the
# dev environment's region, holding every node an environment may have.
CAPACITY_BLOCK = {
    "availability_zone": "us-east-1a",
    "capacity_reservation": json.dumps(
        {"kind": "capacity_block", "id": "cr-0123456789abcdef0", "zone": "us-east-1a", "instances": MAX_NODES}
    ),
}


def instance_variant(compute: str, name: str) -> dict | None:
    """The overrides that run `name` on `compute`, or None where that backend cannot run it (config refuses it)."""
    if not CATALOGUE[name].capacity_blocks_only:
        return {"compute": compute, "instance_type": name}
    return {"compute": compute, "instance_type": name, **(CAPACITY_BLOCK if compute != "sagemaker" else {})}


def app_variants() -> list[dict]:
    """What CI synthesizes: every environment on every backend, every EFA instance type on every backend that can run
    it, and the managed MLflow tracking server (off in the shipped environments) on every backend."""
    per_type = [instance_variant(compute, name) for compute in BACKENDS for name in efa_instance_types()]
    tracked = [{"env": "dev", "compute": compute, "tracking_server": "small"} for compute in BACKENDS]
    return (
        [{"env": env, "compute": compute} for env in ENVIRONMENTS for compute in BACKENDS]
        + [variant for variant in per_type if variant is not None]
        + tracked
    )


def variant_id(variant: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in variant.items())


@dataclass
class Synthesized:
    """One synthesized app: its configuration, cloud assembly and every stack's template."""

    config: EnvironmentConfig
    outdir: Path
    templates: dict[str, dict]  # stack name -> CloudFormation template
    stack_names: dict[str, str]  # unit ("network", "storage", "compute", ...) -> stack name
    context: dict  # the CDK context it was built from
    _stacks: dict[str, cdk.Stack] | None = field(default=None, repr=False)
    _parsed: dict[str, Template] = field(default_factory=dict, repr=False)

    def template(self, unit: str) -> Template:
        """The assertions Template of one unit, e.g. synthesized.template("network")."""
        if unit not in self._parsed:
            self._parsed[unit] = Template.from_json(self.raw(unit))
        return self._parsed[unit]

    def raw(self, unit: str) -> dict:
        return self.templates[self.stack_names[unit]]

    def region(self, unit: str) -> str:
        """The region `cdk deploy` deploys the unit's stack to (its cloud assembly environment)."""
        manifest = json.loads((self.outdir / "manifest.json").read_text())
        return manifest["artifacts"][self.stack_names[unit]]["environment"].rsplit("/", 1)[1]

    @property
    def stacks(self) -> dict[str, cdk.Stack]:
        """The stack objects (built again, without synthesis, where another worker synthesized the app)."""
        if self._stacks is None:
            _, self._stacks = build_app(context=self.context)
        return self._stacks


def _key(config: EnvironmentConfig) -> str:
    digest = hashlib.sha256(repr(config).encode()).hexdigest()[:12]
    return f"{config.name}-{config.compute}-{config.instance_type}-{digest}"


def _drop_file_assets(outdir: Path) -> None:
    """Lambda bundles and layers (60 MB per EKS variant, the kubectl layer): nothing reads them here. Templates and
    Docker build contexts stay."""
    for manifest in outdir.glob("*.assets.json"):
        for asset in json.loads(manifest.read_text()).get("files", {}).values():
            path = outdir / asset["source"]["path"]
            if path.name.startswith("asset.") and path.is_dir():
                shutil.rmtree(path)
            elif path.name.startswith("asset."):
                path.unlink(missing_ok=True)


def synthesize(**overrides: object) -> Synthesized:
    """The app as `cdk synth -c FIELD=VALUE ...` builds it (cdk-nag included), synthesized once per test run."""
    app_context = context(**overrides)
    config = load_config(app_context)
    key = _key(config)
    if key not in _synthesized:
        outdir = shared_directory() / key
        stacks = None
        with locked(outdir):
            if not (outdir / _SUMMARY).exists():
                app, stacks = build_app(context=app_context, outdir=str(outdir))
                assembly = app.synth()
                _drop_file_assets(outdir)
                (outdir / _SUMMARY).write_text(
                    json.dumps(
                        {
                            "units": {unit: stack.stack_name for unit, stack in stacks.items()},
                            "templates": {stack.stack_name: stack.template_file for stack in assembly.stacks},
                        }
                    )
                )
        summary = json.loads((outdir / _SUMMARY).read_text())
        templates = {name: json.loads((outdir / file).read_text()) for name, file in summary["templates"].items()}
        _synthesized[key] = Synthesized(
            config=config,
            outdir=outdir,
            templates=templates,
            stack_names=summary["units"],
            context=app_context,
            _stacks=stacks,
        )
    return _synthesized[key]

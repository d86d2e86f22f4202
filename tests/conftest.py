"""Shared fixtures: each app variant is synthesized once per test session, in-process.

`synth(**overrides)` takes the same overrides as `cdk synth -c FIELD=VALUE` (values as strings,
so the config's coercion is exercised too) and returns a `Synthesized` with every stack's template.
"""

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # before `constructs` is imported, so our folder joins its namespace

from app import build_app  # noqa: E402  (also points jsii at the pinned Node 22)
from aws_cdk.assertions import Template  # noqa: E402

CDK_JSON_CONTEXT = json.loads((ROOT / "cdk.json").read_text())["context"]
ENVIRONMENTS = tuple(CDK_JSON_CONTEXT["environments"])


def app_variants() -> list[dict]:
    """What CI synthesizes: every environment, and every EFA instance type on every backend."""
    from config import efa_instance_types

    return ([{"env": env} for env in ENVIRONMENTS]
            + [{"compute": compute, "instance_type": name} for compute in ("batch", "eks")
               for name in efa_instance_types()])


def variant_id(variant: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in variant.items())


@dataclass
class Synthesized:
    outdir: Path
    templates: dict[str, dict]  # stack name -> CloudFormation template
    stacks: dict  # unit ("network", "storage", ...) -> cdk.Stack

    def template(self, unit: str) -> Template:
        """The assertions Template of one unit, e.g. synthesized.template("network")."""
        return Template.from_json(self.templates[self.stacks[unit].stack_name])

    def raw(self, unit: str) -> dict:
        return self.templates[self.stacks[unit].stack_name]


_CACHE: dict[tuple, Synthesized] = {}
_OUTROOT = Path(tempfile.mkdtemp(prefix="cdk-test-"))


def synthesize(**overrides: object) -> Synthesized:
    key = tuple(sorted((k, str(v)) for k, v in overrides.items()))
    if key not in _CACHE:
        outdir = _OUTROOT / (("-".join(f"{k}={v}" for k, v in key) or "default").replace("/", "_"))
        app, stacks = build_app(context={**CDK_JSON_CONTEXT, **dict(key)}, outdir=str(outdir))
        assembly = app.synth()
        templates = {stack.stack_name: stack.template for stack in assembly.stacks}
        _CACHE[key] = Synthesized(outdir=outdir, templates=templates, stacks=stacks)
    return _CACHE[key]


@pytest.fixture(scope="session")
def synth():
    """Synthesize (once per session) the app with `-c` style overrides: synth(env="prod", nodes=4)."""
    return synthesize

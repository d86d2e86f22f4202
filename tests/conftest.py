"""Shared fixtures. Tests mirror the modules they test: a construct is built alone in a bare `cdk.Stack()`
(tests/<component>/), a stack alone with the stacks it takes (tests/stacks/, through tests/alone.py). Only the
gates, the environment matrix and the contracts that span stacks synthesize the whole app, through `synth`:
`synth(**overrides)` takes the same overrides as `cdk synth -c FIELD=VALUE` and returns a `Synthesized` with every
stack's template, each configuration synthesized once per test run (tests/synthesis.py).
"""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # before `constructs` is imported, so our folder joins its namespace

from tests import synthesis  # noqa: E402  (app.py also points jsii at the pinned Node 22)
from tests.synthesis import (  # noqa: E402,F401  (re-exported for tests that import them from here)
    CDK_JSON_CONTEXT,
    ENVIRONMENTS,
    Synthesized,
    app_variants,
    synthesize,
    variant_id,
)


@pytest.fixture(scope="session", autouse=True)
def _share_synthesis_between_workers(tmp_path_factory, worker_id):
    """Every xdist worker of this run reads and writes cloud assemblies in one directory (the parent of the
    workers' base temps), which pytest removes with its old base temps."""
    base = tmp_path_factory.getbasetemp()
    synthesis.share((base.parent if worker_id != "master" else base) / "synthesized")


@pytest.fixture(scope="session")
def synth():
    """Synthesize (once per test run) the app with `-c` style overrides: synth(env="prod", nodes=4)."""
    return synthesize


@pytest.fixture
def stubbed(monkeypatch):
    """One botocore Stubber per service, shared by every client tools/preflight.py makes (which checks each request
    against the API's model); `stubbed(service)` is that service's Stubber, in us-east-1 (dev's region)."""
    from botocore.stub import Stubber

    from tools import preflight

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    stubs: dict[str, Stubber] = {}
    real = preflight.client

    def client(service, region):
        if service not in stubs:
            stubs[service] = Stubber(real(service, region))
            stubs[service].activate()
        return stubs[service].client

    monkeypatch.setattr(preflight, "client", client)
    return lambda service: client(service, "us-east-1") and stubs[service]

"""A stack built alone: one stack of an environment with the stacks it takes, in a bare App without cdk-nag (the
gates run cdk-nag over the whole app). Each stack gets what app.py's add_stacks gives it; nothing else is built.

    environment = StacksAlone(compute="eks")
    template = environment.template(environment.compute())   # Network, Storage, Registry and Eks only
"""

import importlib
import tempfile
from typing import Any

import aws_cdk as cdk
from aws_cdk.assertions import Template

from app import COMPUTE_STACKS
from config import load_config
from stacks.alerts_stack import AlertsStack
from stacks.network_stack import NetworkStack
from stacks.observability_stack import ObservabilityStack
from stacks.pipeline_stack import PipelineStack
from stacks.registry_stack import RegistryStack
from stacks.storage_stack import StorageStack
from tests.synthesis import context, shared_directory


class StacksAlone:
    """The stacks of one environment (`-c` style overrides), each built on first use."""

    def __init__(self, **overrides: object) -> None:
        app_context = context(**overrides)
        self.config = load_config(app_context)
        self.app = cdk.App(context=app_context, outdir=tempfile.mkdtemp(dir=shared_directory(), prefix="alone-"))
        self._env = cdk.Environment(account=self.config.account, region=self.config.region)
        self._stacks: dict[str, Any] = {}
        self._templates: dict[str, Template] = {}

    def _stack(self, unit: str, build) -> Any:
        if unit not in self._stacks:
            self._stacks[unit] = build()
        return self._stacks[unit]

    def _id(self, unit: str) -> str:
        return f"{self.config.stack_prefix}-{unit}"

    def network(self) -> NetworkStack:
        return self._stack(
            "network", lambda: NetworkStack(self.app, self._id("Network"), config=self.config, env=self._env)
        )

    def storage(self) -> StorageStack:
        return self._stack(
            "storage",
            lambda: StorageStack(
                self.app, self._id("Storage"), config=self.config, network=self.network(), env=self._env
            ),
        )

    def registry(self) -> RegistryStack:
        return self._stack(
            "registry", lambda: RegistryStack(self.app, self._id("Registry"), config=self.config, env=self._env)
        )

    def alerts(self) -> AlertsStack:
        return self._stack(
            "alerts", lambda: AlertsStack(self.app, self._id("Alerts"), config=self.config, env=self._env)
        )

    def compute(self) -> Any:
        """The backend's stack (BatchStack or EksStack), as app.py's COMPUTE_STACKS names it."""
        module, class_name, unit = COMPUTE_STACKS[self.config.compute]
        stack_class = getattr(importlib.import_module(module), class_name)
        return self._stack(
            "compute",
            lambda: stack_class(
                self.app,
                self._id(unit),
                config=self.config,
                network=self.network(),
                storage=self.storage(),
                registry=self.registry(),
                env=self._env,
            ),
        )

    def pipeline(self) -> PipelineStack:
        return self._stack(
            "pipeline",
            lambda: PipelineStack(
                self.app,
                self._id("Pipeline"),
                config=self.config,
                storage=self.storage(),
                alerts=self.alerts(),
                compute=self.compute(),
                env=self._env,
            ),
        )

    def observability(self) -> ObservabilityStack:
        return self._stack(
            "observability",
            lambda: ObservabilityStack(
                self.app,
                self._id("Observability"),
                config=self.config,
                storage=self.storage(),
                alerts=self.alerts(),
                compute=self.compute(),
                pipeline=self.pipeline(),
                env=self._env,
            ),
        )

    def template(self, stack: cdk.Stack) -> Template:
        """The stack's template (synthesizes the stacks built so far, once per stack: build every stack a test needs
        first, CDK refuses new stacks after a synthesis)."""
        if stack.stack_name not in self._templates:
            self._templates[stack.stack_name] = Template.from_stack(stack)
        return self._templates[stack.stack_name]

    def raw(self, stack: cdk.Stack) -> dict:
        return dict(self.template(stack).to_json())


def template_of(stack: cdk.Stack) -> dict:
    """A bare stack's template as a dict (one construct built alone in it)."""
    return dict(Template.from_stack(stack).to_json())


def bare_stack(env: cdk.Environment | None = None) -> cdk.Stack:
    """A bare stack for one construct, its App's output under the test run's directory (an EKS cluster stages a
    60 MB kubectl layer, which pytest then removes with its old temporary folders)."""
    app = cdk.App(outdir=tempfile.mkdtemp(dir=shared_directory(), prefix="bare-"))
    return cdk.Stack(app, "Stack", env=env)

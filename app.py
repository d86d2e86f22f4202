#!/usr/bin/env python3
"""The CDK app: validate the selected environment's configuration, then build its stacks.

`cdk synth` (and `make synth`) run this file with `-c env=NAME -c FIELD=VALUE ...`;
tests call `build_app()` in-process to synthesize each variant once.
"""

import importlib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
# jsii starts a Node.js process: use the pinned Node 22 from package.json, not the system's end-of-life one.
_PINNED_NODE = ROOT / "node_modules" / ".bin" / "node"
if _PINNED_NODE.exists():
    os.environ.setdefault("JSII_NODE", str(_PINNED_NODE))

import aws_cdk as cdk  # noqa: E402  (after JSII_NODE is set)
from cdk_nag import AwsSolutionsChecks  # noqa: E402

from config import ConfigError, EnvironmentConfig, load_config  # noqa: E402
from config.layout import PROJECT  # noqa: E402
from stacks.alerts_stack import AlertsStack  # noqa: E402
from stacks.network_stack import NetworkStack  # noqa: E402
from stacks.observability_stack import ObservabilityStack  # noqa: E402
from stacks.pipeline_stack import PipelineStack  # noqa: E402
from stacks.registry_stack import RegistryStack  # noqa: E402
from stacks.storage_stack import StorageStack  # noqa: E402

# One line per compute backend: config field `compute` -> the stack implementing ComputeBackend, imported only
# when chosen (only EKS variants pay for importing aws_eks_v2). The stack's id is `<prefix>-<Name>`.
COMPUTE_STACKS = {
    "batch": ("stacks.batch_stack", "BatchStack", "Batch"),
    "eks": ("stacks.eks_stack", "EksStack", "Eks"),
    "sagemaker": ("stacks.sagemaker_stack", "SageMakerStack", "SageMaker"),
}


def add_stacks(app: cdk.App, config: EnvironmentConfig) -> dict[str, cdk.Stack]:
    """Every stack of one environment, named `EfaTraining-<env>-<Unit>`, tagged for cost allocation."""
    env = cdk.Environment(account=config.account or os.environ.get("CDK_DEFAULT_ACCOUNT"), region=config.region)
    prefix = config.stack_prefix
    network = NetworkStack(app, f"{prefix}-Network", config=config, env=env)
    storage = StorageStack(app, f"{prefix}-Storage", config=config, network=network, env=env)
    registry = RegistryStack(app, f"{prefix}-Registry", config=config, env=env)
    alerts = AlertsStack(app, f"{prefix}-Alerts", config=config, env=env)
    module, class_name, unit = COMPUTE_STACKS[config.compute]
    compute_stack = getattr(importlib.import_module(module), class_name)
    compute = compute_stack(
        app, f"{prefix}-{unit}", config=config, network=network, storage=storage, registry=registry, env=env
    )
    pipeline = PipelineStack(
        app, f"{prefix}-Pipeline", config=config, storage=storage, alerts=alerts, compute=compute, env=env
    )
    observability = ObservabilityStack(
        app,
        f"{prefix}-Observability",
        config=config,
        storage=storage,
        alerts=alerts,
        compute=compute,
        pipeline=pipeline,
        env=env,
    )
    # Every resource carries the project and environment: the cost-allocation tags budgets filter on.
    cdk.Tags.of(app).add("Project", PROJECT)
    cdk.Tags.of(app).add("Environment", config.name)
    return {
        "network": network,
        "storage": storage,
        "registry": registry,
        "alerts": alerts,
        "compute": compute,
        "pipeline": pipeline,
        "observability": observability,
    }


def build_app(context: dict | None = None, outdir: str | None = None) -> tuple[cdk.App, dict[str, cdk.Stack]]:
    """Validate first (ConfigError on a user's mistake), then build; cdk-nag runs at synth."""
    app = cdk.App(context=context, outdir=outdir)
    config = load_config(app.node.get_all_context())
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app, add_stacks(app, config)


def main() -> int:
    try:
        app, _ = build_app()
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())

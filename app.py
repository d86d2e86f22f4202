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
    # Each stack depends on every stack it is given, whether or not a reference shows it: an imported export, a
    # weak reference or an image the Registry stack publishes. `cdk deploy <one stack>` then deploys what it uses
    # first, and --concurrency never runs a consumer before its producer (tests/test_stack_dependencies.py).
    for consumer, producers in (
        (storage, [network]),
        (compute, [network, storage, registry]),
        (pipeline, [network, storage, registry, alerts, compute]),
        (observability, [storage, alerts, compute, pipeline]),
    ):
        for producer in producers:
            consumer.add_stack_dependency(producer, "uses its exports, outputs or image")
    tag(app, config)
    return {
        "network": network,
        "storage": storage,
        "registry": registry,
        "alerts": alerts,
        "compute": compute,
        "pipeline": pipeline,
        "observability": observability,
    }


# Types whose Tags are create-only (their CloudFormation resource schemas' createOnlyProperties, as cfn-lint bundles
# them): a changed tag replaces the resource, and replacing a Batch queue terminates its jobs (Batch API reference,
# DeleteJobQueue); a replaced placement group gives every host launch template a new version. They carry only the
# two tags whose values never change for an environment (tests/test_tags.py holds the list to the schemas).
CREATE_ONLY_TAGS = (
    "AWS::Batch::ComputeEnvironment",
    "AWS::Batch::JobQueue",
    "AWS::Batch::SchedulingPolicy",
    "AWS::EC2::PlacementGroup",
)


def tag(app: cdk.App, config: EnvironmentConfig) -> None:
    """Every resource carries the project and environment (the cost-allocation tags budgets filter on); the
    user's `tags` go on every resource that takes a tag change in place."""
    fixed = {"Project": PROJECT, "Environment": config.name}
    for key, value in {**fixed, **config.tag_map}.items():
        cdk.Tags.of(app).add(key, value, exclude_resource_types=list(CREATE_ONLY_TAGS))
    for key, value in fixed.items():
        cdk.Tags.of(app).add(key, value, include_resource_types=list(CREATE_ONLY_TAGS))


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

"""Day two: the routine changes a user makes, each synthesized before and after on every backend, and what a
`cdk deploy` would then do (tests/change_matrix.py computes it the way the CLI and CloudFormation decide it).

No routine change may replace a compute environment, queue, scheduling policy, file system, bucket, cluster, node
group or state machine (a replaced queue terminates its jobs: Batch API reference, DeleteJobQueue), and no consumer
may keep a value its producer changed (a weak reference is resolved only when its consumer is updated:
CloudFormation template reference, "Fn::GetStackOutput").
"""

import json

import pytest

from config import load_config
from tests.change_matrix import COMPUTE_ENVIRONMENT, Redeploy, redeploy, with_new_image
from tests.synthesis import CDK_JSON_CONTEXT, context

pytestmark = pytest.mark.slow  # whole-app synthesis of every variant it checks

BACKENDS = ("batch", "eks", "sagemaker")
NEVER_REPLACED = (
    "AWS::Batch::ComputeEnvironment",
    "AWS::Batch::JobQueue",
    "AWS::Batch::SchedulingPolicy",
    "AWS::FSx::FileSystem",
    "AWS::S3::Bucket",
    "AWS::EKS::Cluster",
    "AWS::EKS::Nodegroup",
    "AWS::StepFunctions::StateMachine",
    "AWS::EC2::PlacementGroup",
    "AWS::Budgets::Budget",
)
# One entry per routine change (several settings of one stack together where they touch only that stack).
ROUTINE_CHANGES: dict[str, dict[str, object]] = {
    "an app-wide tag": {"tags": "CostCenter=ml-42"},
    "alarms, budget and e-mails": {
        "budget_monthly_usd": 5000,
        "gpu_idle_threshold_percent": 10,
        "alert_emails": "ml-platform-dev@example.com,oncall@example.com",
    },
    "the node count": {"nodes": 4},
    "the training timeout": {"batch_train_timeout_hours": 48},
    "the capacity waits": {"capacity_wait_hours": 6, "batch_capacity_wait_minutes": 30},
    "the instance type": {"instance_type": "p4d.24xlarge"},
}


def _of_type(template: dict, kind: str) -> dict[str, dict]:
    return {logical: r for logical, r in template["Resources"].items() if r["Type"] == kind}


def _placed(environment: dict) -> bool:
    return "PlacementGroup" in environment["Properties"]["ComputeResources"]


def _assert_safe(change: Redeploy) -> None:
    assert change.replaced_of_type(NEVER_REPLACED) == []
    assert change.stale == []
    assert change.blocked == []


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ROUTINE_CHANGES)
def test_a_routine_change_replaces_nothing_that_runs_and_leaves_nothing_stale(synth, backend, name):
    before, after = synth(compute=backend), synth(compute=backend, **ROUTINE_CHANGES[name])
    change = redeploy(before.templates, after.templates, before.config.region)
    _assert_safe(change)
    assert change.deployed, "the change left every template as it was: nothing was compared"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_new_training_image_redeploys_every_stack_that_runs_it(synth, backend):
    # A change to training_image/ gives the image asset a new hash; every template holding its URI changes, so the
    # CLI deploys those stacks (on Batch the job definitions' new revisions, named, not referenced).
    before = synth(compute=backend).templates
    after = with_new_image(before)
    change = redeploy(before, after, "us-east-1")
    _assert_safe(change)
    assert change.deployed, "the image's URI is in no template"


@pytest.mark.parametrize("backend", ["batch", "eks"])
def test_adding_an_on_demand_reservation_deletes_the_placement_group_and_replaces_nothing_else(synth, backend):
    # A new launch-template version (its target), and the compute environment or node group updated in place: the
    # zone is availability_zone's before and after (config/capacity.py), so neither subnet nor file system moves.
    # The cluster placement group goes away (hosts in a reservation are placed where it is: stacks/batch_stack.py,
    # constructs/compute/eks/accelerator_nodegroup.py), so CloudFormation deletes it; on Batch the multi-node
    # compute environment goes through an infrastructure update (its PlacementGroup and launch template change).
    # The pipeline's state machine is updated too: it now reads the reservation's end as a run starts.
    reservation = '{"kind": "on_demand", "id": "cr-0123456789abcdef0", "zone": "us-east-1a", "instances": 2}'
    before = synth(compute=backend, availability_zone="us-east-1a")
    after = synth(compute=backend, availability_zone="us-east-1a", capacity_reservation=reservation)
    change = redeploy(before.templates, after.templates, before.config.region)
    stack = f"EfaTraining-dev-{backend.capitalize()}"
    (group,) = _of_type(before.templates[stack], "AWS::EC2::PlacementGroup")
    assert change.replaced_of_type(NEVER_REPLACED) == [f"{stack}/{group} (AWS::EC2::PlacementGroup, deleted)"]
    assert change.stale == [] and change.blocked == []
    placed = {(stack, ce) for ce, r in _of_type(before.templates[stack], COMPUTE_ENVIRONMENT).items() if _placed(r)}
    assert change.infrastructure_updated == placed and len(placed) == (backend == "batch")
    assert {name.rsplit("-", 1)[1] for name in change.deployed} == {backend.capitalize(), "Pipeline"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_turning_on_the_managed_tracking_server_replaces_nothing_that_runs(synth, backend):
    # config tracking_server: the server and its role in the storage stack; the jobs' environment and role in place.
    before, after = synth(compute=backend), synth(env="dev", compute=backend, tracking_server="small")
    change = redeploy(before.templates, after.templates, before.config.region)
    _assert_safe(change)
    assert any(name.endswith("-Storage") for name in change.deployed)


def test_resizing_the_managed_tracking_server_keeps_it_and_its_runs(synth):
    # AWS::SageMaker::MlflowTrackingServer: TrackingServerSize "Update requires: No interruption"; the name, its one
    # create-only property, is the environment's (CloudFormation template reference).
    before = synth(env="dev", compute="batch", tracking_server="small")
    after = synth(env="dev", compute="batch", tracking_server="medium")
    change = redeploy(before.templates, after.templates, before.config.region)
    _assert_safe(change)
    assert change.replaced_of_type(("AWS::SageMaker::MlflowTrackingServer",)) == []
    assert {name.rsplit("-", 1)[1] for name in change.deployed} == {"Storage"}


def test_a_new_image_tag_replaces_nothing_and_leaves_nothing_stale(synth):
    before, after = synth(compute="batch", image_tag="v1"), synth(compute="batch", image_tag="v2")
    change = redeploy(before.templates, after.templates, before.config.region)
    _assert_safe(change)
    assert {name.rsplit("-", 1)[1] for name in change.deployed} == {"Batch"}  # the pipeline names the definitions


def test_adding_an_environment_changes_nothing_in_the_others():
    # The app is a function of the selected environment's validated configuration (tests/synthesis.py keys its
    # cache on it): a new environment in cdk.json leaves dev's configuration, so its templates, as they were.
    environments = {**CDK_JSON_CONTEXT["environments"], "staging": {"region": "eu-west-1", "compute": "eks"}}
    assert load_config({**context(), "environments": environments}) == load_config(context())


# ---- deletions, renames, infrastructure updates and values resolved at deploy time -------------------------------
BATCH = "EfaTraining-dev-Batch"


@pytest.mark.parametrize("kind", [COMPUTE_ENVIRONMENT, "AWS::Batch::JobQueue", "AWS::EC2::PlacementGroup"])
def test_a_renamed_logical_id_is_reported_as_deleted(synth, kind):
    # A changed logical id: CloudFormation creates a resource under the new one and deletes the existing one (CDK
    # developer guide, "Identifiers", logical ID stability); a deleted queue ends its jobs (Batch API, DeleteJobQueue).
    before = synth(compute="batch").templates
    old = sorted(_of_type(before[BATCH], kind))[0]
    after = json.loads(json.dumps(before).replace(f'"{old}"', f'"{old}Renamed"'))
    change = redeploy(before, after, "us-east-1")
    assert f"{BATCH}/{old} ({kind}, deleted)" in change.replaced_of_type(NEVER_REPLACED)
    assert (BATCH, f"{old}Renamed") not in change.replaced  # created, not replaced


def test_a_tag_change_sends_every_compute_environment_through_an_infrastructure_update(synth):
    # The tag versions both launch templates (TagSpecifications): every compute environment reading its template's
    # LatestVersionNumber changes ComputeResources.LaunchTemplate, which with ReplaceComputeEnvironment false is an
    # infrastructure update (CloudFormation template reference, AWS::Batch::ComputeEnvironment): new instances,
    # running jobs kept up to JobExecutionTimeoutMinutes (Batch user guide, "Updating compute environments").
    before, after = synth(compute="batch").templates, synth(compute="batch", tags="CostCenter=ml-42").templates
    change = redeploy(before, after, "us-east-1")
    environments = _of_type(after[BATCH], COMPUTE_ENVIRONMENT)
    versioned = {
        (BATCH, logical)
        for logical, environment in environments.items()
        if environment["Properties"]["ComputeResources"]["LaunchTemplate"]["Version"]["Fn::GetAtt"][1]
        == "LatestVersionNumber"
    }
    assert change.infrastructure_updated == versioned == {(BATCH, logical) for logical in environments}
    assert change.replaced_of_type(NEVER_REPLACED) == []
    minutes = environments[sorted(environments)[0]]["Properties"]["UpdatePolicy"]["JobExecutionTimeoutMinutes"]
    assert change.infrastructure_updates()[0] == (
        f"{BATCH}/{sorted(environments)[0]} ({COMPUTE_ENVIRONMENT}, running jobs run {minutes} min)"
    )


def test_the_neuron_ami_read_from_parameter_store_may_change_on_every_deploy(synth):
    # Trainium hosts take the ECS Neuron AMI from an SSM parameter type: the CLI always deploys a stack that has one
    # (aws-cdk, ParameterValues.hasChanges) and CloudFormation fetches its latest value on every update (CloudFormation
    # user guide, "Systems Manager parameter types"), so each deploy may change every ImageIdOverride: an
    # infrastructure update of every compute environment, with no change to the app at all.
    templates = synth(compute="batch", instance_type="trn1.32xlarge").templates
    change = redeploy(templates, templates, "us-east-1")
    environments = {(BATCH, logical) for logical in _of_type(templates[BATCH], COMPUTE_ENVIRONMENT)}
    assert change.deployed == {BATCH}
    assert change.infrastructure_updated == change.every_deploy == environments
    assert all(line.endswith("may change on every deploy)") for line in change.infrastructure_updates())
    assert change.replaced == set()
    nvidia = synth(compute="batch").templates  # Batch's own ECS NVIDIA image type: nothing resolved at deploy time
    assert redeploy(nvidia, nvidia, "us-east-1") == Redeploy()


# ---- the analysis itself, on small templates ---------------------------------------------------------------------
def _stack(resources: dict, outputs: dict | None = None) -> dict:
    return {"Resources": resources, **({"Outputs": outputs} if outputs else {})}


def _weakly(stack: str, output: str) -> dict:
    return {"Fn::GetStackOutput": {"StackName": stack, "Region": "us-east-1", "OutputName": output}}


def _app(image: str, *, queue_tags: dict, by_name: bool) -> dict[str, dict]:
    definition = {"Type": "AWS::Batch::JobDefinition", "Properties": {"Type": "container", "Image": image}}
    queue = {"Type": "AWS::Batch::JobQueue", "Properties": {"Priority": 1, "Tags": queue_tags}}
    producer = _stack({"Train": definition, "Queue": queue}, {"TrainArn": {"Value": {"Ref": "Train"}}})
    machine = {
        "Type": "AWS::StepFunctions::StateMachine",
        "Properties": {"DefinitionString": "efa-training-dev-train" if by_name else _weakly("Batch", "TrainArn")},
    }
    return {"Batch": producer, "Pipeline": _stack({"Machine": machine})}


def test_a_job_definition_read_by_arn_is_stale_after_a_new_image():
    # The review's finding: the definition's new revision (its Ref) while the pipeline's template is unchanged.
    change = redeploy(_app("a", queue_tags={}, by_name=False), _app("b", queue_tags={}, by_name=False), "us-east-1")
    assert change.deployed == {"Batch"} and change.stale == ["Pipeline keeps the old value of Batch.TrainArn"]
    fixed = redeploy(_app("a", queue_tags={}, by_name=True), _app("b", queue_tags={}, by_name=True), "us-east-1")
    assert fixed.stale == []


def test_a_changed_tag_replaces_a_queue():
    # AWS::Batch::JobQueue lists /properties/Tags among its createOnlyProperties (its resource schema).
    before = _app("a", queue_tags={"Team": "a"}, by_name=True)
    after = _app("a", queue_tags={"Team": "b"}, by_name=True)
    change = redeploy(before, after, "us-east-1")
    assert change.replaced_of_type(NEVER_REPLACED) == ["Batch/Queue (AWS::Batch::JobQueue)"]


def test_a_replacement_reaches_what_reads_it_in_a_create_only_property():
    # A subnet whose range changes is replaced; a file system in it (SubnetIds is create-only) is replaced too.
    def app(cidr: str) -> dict[str, dict]:
        subnet = {"Type": "AWS::EC2::Subnet", "Properties": {"VpcId": "vpc-1", "CidrBlock": cidr}}
        lustre = {
            "Type": "AWS::FSx::FileSystem",
            "Properties": {"FileSystemType": "LUSTRE", "SubnetIds": [{"Ref": "Subnet"}]},
        }
        return {"Storage": _stack({"Subnet": subnet, "Lustre": lustre})}

    change = redeploy(app("10.0.0.0/24"), app("10.0.1.0/24"), "us-east-1")
    assert change.replaced == {("Storage", "Subnet"), ("Storage", "Lustre")}


def test_an_unchanged_output_keeps_its_consumers_current():
    before = _app("a", queue_tags={}, by_name=False)
    assert redeploy(before, before, "us-east-1") == Redeploy()


def _environment(*, replace: bool | None, strategy: str | None, maxv: int = 8) -> dict:
    version = {"Fn::GetAtt": ["Template", "LatestVersionNumber"]}
    resources = {"LaunchTemplate": {"Version": version}, "MaxvCpus": maxv, "Type": "EC2", "Subnets": ["subnet-1"]}
    props: dict = {"Type": "managed", "ComputeResources": resources}
    if strategy:
        resources["AllocationStrategy"] = strategy
    if replace is not None:
        props["ReplaceComputeEnvironment"] = replace
    return {"Type": COMPUTE_ENVIRONMENT, "Properties": props}


def _batch(image: object, environment: dict, *, parameter: bool = False) -> dict[str, dict]:
    template = {"Type": "AWS::EC2::LaunchTemplate", "Properties": {"LaunchTemplateData": {"ImageId": image}}}
    stack: dict = {"Resources": {"Template": template, "Environment": environment}}
    if parameter:
        stack["Parameters"] = {"Ami": {"Type": "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>", "Default": "/ami"}}
    return {"Batch": stack}


@pytest.mark.parametrize(
    ("replace", "strategy", "replaced"),
    [
        (None, "BEST_FIT_PROGRESSIVE", True),  # ReplaceComputeEnvironment defaults to true
        (False, "BEST_FIT_PROGRESSIVE", False),
        (False, "SPOT_PRICE_CAPACITY_OPTIMIZED", False),
        (False, None, True),  # BEST_FIT, the default strategy: no infrastructure update
    ],
)
def test_a_new_launch_template_version_replaces_or_updates_the_compute_environment(replace, strategy, replaced):
    # ComputeResources properties are create-only unless ReplaceComputeEnvironment is false (CloudFormation template
    # reference, AWS::Batch::ComputeEnvironment); infrastructure updates need a strategy other than BEST_FIT (Batch
    # user guide, "Updating compute environments"). The template's new version renews its LatestVersionNumber.
    environment = _environment(replace=replace, strategy=strategy)
    change = redeploy(_batch("ami-1", environment), _batch("ami-2", environment), "us-east-1")
    key = {("Batch", "Environment")}
    assert (change.replaced, change.infrastructure_updated) == ((key, set()) if replaced else (set(), key))


def test_more_vcpus_is_a_scaling_update():
    # MaxvCpus and MinvCpus alone: a scaling update, no instance replaced (Batch user guide, as above).
    before = _batch("ami-1", _environment(replace=False, strategy="BEST_FIT_PROGRESSIVE"))
    after = _batch("ami-1", _environment(replace=False, strategy="BEST_FIT_PROGRESSIVE", maxv=16))
    change = redeploy(before, after, "us-east-1")
    assert change.deployed == {"Batch"} and change.replaced == change.infrastructure_updated == set()


@pytest.mark.parametrize(
    ("image", "parameter", "unchanged_deploys", "changes_when_deployed"),
    [
        ({"Ref": "Ami"}, True, True, True),  # an SSM parameter type: the CLI always deploys the stack
        ("{{resolve:ssm:/ami}}", False, False, True),  # a dynamic reference: fetched again when the stack deploys
        ("{{resolve:ssm:/ami:3}}", False, False, False),  # a version pinned: it never changes
    ],
)
def test_a_value_from_parameter_store_may_change_whenever_its_stack_deploys(
    image, parameter, unchanged_deploys, changes_when_deployed
):
    # "CloudFormation always fetches the latest values from Parameter Store when it updates stacks" (CloudFormation
    # user guide, "Systems Manager parameter types"); an ssm dynamic reference without a version reads the latest
    # ("Get a plaintext value from Systems Manager Parameter Store"). The launch template may get a new version,
    # and so the compute environment an infrastructure update.
    environment = _environment(replace=False, strategy="BEST_FIT_PROGRESSIVE")
    bigger = _environment(replace=False, strategy="BEST_FIT_PROGRESSIVE", maxv=16)  # deploys the stack anyway
    before = _batch(image, environment, parameter=parameter)
    same = redeploy(before, before, "us-east-1")
    assert same.deployed == ({"Batch"} if unchanged_deploys else set())
    assert same.infrastructure_updated == ({("Batch", "Environment")} if unchanged_deploys else set())
    change = redeploy(before, _batch(image, bigger, parameter=parameter), "us-east-1")
    flagged = {("Batch", "Template"), ("Batch", "Environment")} if changes_when_deployed else set()
    assert change.every_deploy == flagged
    assert change.infrastructure_updated == flagged - {("Batch", "Template")}

"""Day two: the routine changes a user makes, each synthesized before and after on every backend, and what a
`cdk deploy` would then do (tests/change_matrix.py computes it the way the CLI and CloudFormation decide it).

No routine change may replace a compute environment, queue, scheduling policy, file system, bucket, cluster, node
group or state machine (a replaced queue terminates its jobs: Batch API reference, DeleteJobQueue), and no consumer
may keep a value its producer changed (a weak reference is resolved only when its consumer is updated:
CloudFormation template reference, "Fn::GetStackOutput").
"""

import pytest

from config import load_config
from tests.change_matrix import Redeploy, redeploy, with_new_image
from tests.synthesis import CDK_JSON_CONTEXT, context

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


def _assert_safe(change: Redeploy, after: dict[str, dict]) -> None:
    assert change.replaced_of_type(after, NEVER_REPLACED) == []
    assert change.stale == []
    assert change.blocked == []


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ROUTINE_CHANGES)
def test_a_routine_change_replaces_nothing_that_runs_and_leaves_nothing_stale(synth, backend, name):
    before, after = synth(compute=backend), synth(compute=backend, **ROUTINE_CHANGES[name])
    change = redeploy(before.templates, after.templates, before.config.region)
    _assert_safe(change, after.templates)
    assert change.deployed, "the change left every template as it was: nothing was compared"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_new_training_image_redeploys_every_stack_that_runs_it(synth, backend):
    # A change to training_image/ gives the image asset a new hash; every template holding its URI changes, so the
    # CLI deploys those stacks (on Batch the job definitions' new revisions, named, not referenced).
    before = synth(compute=backend).templates
    after = with_new_image(before)
    change = redeploy(before, after, "us-east-1")
    _assert_safe(change, after)
    assert change.deployed, "the image's URI is in no template"


@pytest.mark.parametrize("backend", ["batch", "eks"])
def test_adding_an_on_demand_reservation_replaces_nothing_that_runs(synth, backend):
    # A new launch-template version (its target), and the compute environment or node group updated in place: the
    # zone is availability_zone's before and after (config/capacity.py), so neither subnet nor file system moves.
    # The pipeline's state machine is updated too: it now reads the reservation's end as a run starts.
    reservation = '{"kind": "on_demand", "id": "cr-0123456789abcdef0", "zone": "us-east-1a", "instances": 2}'
    before = synth(compute=backend, availability_zone="us-east-1a")
    after = synth(compute=backend, availability_zone="us-east-1a", capacity_reservation=reservation)
    change = redeploy(before.templates, after.templates, before.config.region)
    _assert_safe(change, after.templates)
    assert {name.rsplit("-", 1)[1] for name in change.deployed} == {backend.capitalize(), "Pipeline"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_turning_on_the_managed_tracking_server_replaces_nothing_that_runs(synth, backend):
    # config tracking_server: the server and its role in the storage stack; the jobs' environment and role in place.
    before, after = synth(compute=backend), synth(env="dev", compute=backend, tracking_server="small")
    change = redeploy(before.templates, after.templates, before.config.region)
    _assert_safe(change, after.templates)
    assert any(name.endswith("-Storage") for name in change.deployed)


def test_resizing_the_managed_tracking_server_keeps_it_and_its_runs(synth):
    # AWS::SageMaker::MlflowTrackingServer: TrackingServerSize "Update requires: No interruption"; the name, its one
    # create-only property, is the environment's (CloudFormation template reference).
    before = synth(env="dev", compute="batch", tracking_server="small")
    after = synth(env="dev", compute="batch", tracking_server="medium")
    change = redeploy(before.templates, after.templates, before.config.region)
    _assert_safe(change, after.templates)
    assert change.replaced_of_type(after.templates, ("AWS::SageMaker::MlflowTrackingServer",)) == []
    assert {name.rsplit("-", 1)[1] for name in change.deployed} == {"Storage"}


def test_a_new_image_tag_replaces_nothing_and_leaves_nothing_stale(synth):
    before, after = synth(compute="batch", image_tag="v1"), synth(compute="batch", image_tag="v2")
    change = redeploy(before.templates, after.templates, before.config.region)
    _assert_safe(change, after.templates)
    assert {name.rsplit("-", 1)[1] for name in change.deployed} == {"Batch"}  # the pipeline names the definitions


def test_adding_an_environment_changes_nothing_in_the_others():
    # The app is a function of the selected environment's validated configuration (tests/synthesis.py keys its
    # cache on it): a new environment in cdk.json leaves dev's configuration, so its templates, as they were.
    environments = {**CDK_JSON_CONTEXT["environments"], "staging": {"region": "eu-west-1", "compute": "eks"}}
    assert load_config({**context(), "environments": environments}) == load_config(context())


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
    assert change.replaced_of_type(after, NEVER_REPLACED) == ["Batch/Queue (AWS::Batch::JobQueue)"]


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

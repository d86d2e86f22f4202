"""BatchStack alone (with the network, storage and registry it takes), per catalogue EFA instance type: hosts in one
placement group, compute environments and fair-share queues, the job role and logs, the pipeline's attributes.
Its constructs alone: tests/compute/ (launch template, host user data, job definitions, job runner)."""

import functools
import json

import aws_cdk.aws_batch as batch
import pytest

from config import CATALOGUE, efa_instance_types
from contracts.job_environment import STOP_GRACE_SECONDS
from stacks.batch_stack import CAPACITY_WAIT_MINUTES, NEURON_AMI_PARAMETER
from tests.alone import StacksAlone
from tests.synthesis import CAPACITY_BLOCK, CDK_JSON_CONTEXT

# The Batch backend takes no Capacity Block: types EC2 sells only through them are refused there (config).
TYPES = [name for name in efa_instance_types() if not CATALOGUE[name].capacity_blocks_only]
NODES = CDK_JSON_CONTEXT["environments"]["dev"]["nodes"]
# The module's stacks are built once, on one xdist worker.
pytestmark = pytest.mark.xdist_group("batch-stack")


@functools.cache
def _environment(**overrides: object) -> StacksAlone:
    return StacksAlone(compute="batch", **overrides)


@functools.cache
def _template(**overrides: object) -> dict:
    environment = _environment(**overrides)
    return environment.raw(environment.compute())


def _batch(name: str = "g5.12xlarge") -> dict:
    return _template(instance_type=name)


def _resources(template: dict, kind: str) -> dict:
    return {k: v["Properties"] for k, v in template["Resources"].items() if v["Type"] == kind}


def _one(template: dict, kind: str, id_prefix: str) -> dict:
    (props,) = [p for k, p in _resources(template, kind).items() if k.startswith(id_prefix)]
    return props


@pytest.mark.parametrize("name", TYPES)
def test_multi_node_hosts_carry_the_efa_group_on_every_interface(name):
    # Multi-node hosts: one interface per EFA card of the catalogue type (the primary `efa`, then `efa-only`), the
    # network stack's EFA group on each, none on the template (EC2 rejects both).
    data = _one(_batch(name), "AWS::EC2::LaunchTemplate", "MultiNodeLaunchTemplate")["LaunchTemplateData"]
    interfaces = data["NetworkInterfaces"]
    assert [i["InterfaceType"] for i in interfaces] == ["efa"] + ["efa-only"] * (CATALOGUE[name].efa_interfaces - 1)
    groups = {json.dumps(i["Groups"]) for i in interfaces}
    assert len(groups) == 1 and "EfaSecurityGroup" in groups.pop()
    assert all("SubnetId" not in i for i in interfaces) and "SecurityGroupIds" not in data


@pytest.mark.parametrize("name", efa_instance_types())
def test_multi_node_hosts_leave_card_0_a_place_for_the_task_interface(name):
    # A multi-node job's container "gets its own elastic network interface" (Batch user guide, "Compute environment
    # considerations for MNP"), on card 0 by default (EC2 API reference, AttachNetworkInterface): with it, no card
    # holds more than NetworkCardInfo.MaximumNetworkInterfaces (p5, p5e, trn2: 2, eksctl-io/eksctl#7520). The types
    # EC2 sells only as Capacity Blocks are synthesized with one.
    block = {k: str(v) for k, v in CAPACITY_BLOCK.items()} if CATALOGUE[name].capacity_blocks_only else {}
    data = _one(_template(instance_type=name, **block), "AWS::EC2::LaunchTemplate", "MultiNodeLaunchTemplate")
    data = data["LaunchTemplateData"]
    cards = [i["NetworkCardIndex"] for i in data["NetworkInterfaces"]] + [0]  # + the task interface
    assert max(cards.count(card) for card in set(cards)) <= CATALOGUE[name].max_interfaces_per_network_card


def test_placement_group_is_cluster():
    # Every node of a job in one cluster placement group, referenced by the multi-node environment.
    template = _batch()
    (group_id,) = _resources(template, "AWS::EC2::PlacementGroup")
    assert _resources(template, "AWS::EC2::PlacementGroup")[group_id]["Strategy"] == "cluster"
    resources = _one(template, "AWS::Batch::ComputeEnvironment", "MultiNodeEnvironment")["ComputeResources"]
    assert resources["PlacementGroup"] == {"Fn::GetAtt": [group_id, "GroupName"]}


@pytest.mark.parametrize("name", TYPES)
def test_multi_node_environment_is_on_demand_in_the_training_subnet(name):
    # On-demand (EC2), the one training subnet, no SecurityGroupIds, 0..nodes x vCPUs, the catalogue's type.
    resources = _one(_batch(name), "AWS::Batch::ComputeEnvironment", "MultiNodeEnvironment")["ComputeResources"]
    assert resources["Type"] == "EC2"
    (subnet,) = resources["Subnets"]
    assert "TrainingSubnet" in json.dumps(subnet)
    assert "SecurityGroupIds" not in resources
    assert resources["InstanceTypes"] == [name]
    assert resources["MinvCpus"] == 0 and resources["MaxvCpus"] == NODES * CATALOGUE[name].vcpus
    assert "LatestVersionNumber" in json.dumps(resources["LaunchTemplate"]["Version"])


@pytest.mark.parametrize("name", TYPES)
def test_multi_node_environment_uses_the_accelerator_image(name):
    # GPU hosts: ECS_AL2023_NVIDIA; Neuron hosts: the ECS AL2023 Neuron AMI from its SSM parameter.
    template = _batch(name)
    resources = _one(template, "AWS::Batch::ComputeEnvironment", "MultiNodeEnvironment")["ComputeResources"]
    (image,) = resources["Ec2Configuration"]
    assert image["ImageType"] == CATALOGUE[name].batch_image_type
    if CATALOGUE[name].accelerator.value == "neuron":
        parameter = image["ImageIdOverride"]["Ref"]
        assert template["Parameters"][parameter]["Default"] == NEURON_AMI_PARAMETER
        assert NEURON_AMI_PARAMETER == "/aws/service/ecs/optimized-ami/amazon-linux-2023/neuron/recommended/image_id"
    else:
        assert "ImageIdOverride" not in image


@pytest.mark.parametrize("name", TYPES)
def test_validation_hosts_are_the_catalogues_small_type(name):
    # Validation runs on the catalogue's single-accelerator type of the same family, on Spot and on-demand.
    small = CATALOGUE[CATALOGUE[name].validation_instance_type]
    for env_id in ("SingleNodeEnvironment", "SingleNodeOnDemandEnvironment"):
        resources = _one(_batch(name), "AWS::Batch::ComputeEnvironment", env_id)["ComputeResources"]
        assert resources["InstanceTypes"] == [small.name]


def test_single_node_environment_is_spot_with_security_groups():
    # Validation hosts: Spot by default on the catalogue's small type, the same subnet, no EFA interfaces,
    # security groups on the environment; an on-demand twin for when Spot capacity is short.
    template = _batch()
    resources = _one(template, "AWS::Batch::ComputeEnvironment", "SingleNodeEnvironment")["ComputeResources"]
    assert resources["Type"] == "SPOT" and resources["InstanceTypes"] == ["g5.xlarge"]
    on_demand = _one(template, "AWS::Batch::ComputeEnvironment", "SingleNodeOnDemandEnvironment")["ComputeResources"]
    assert on_demand["Type"] == "EC2" and on_demand["InstanceTypes"] == ["g5.xlarge"]
    assert len(resources["SecurityGroupIds"]) == 1 and "PlacementGroup" not in resources
    assert "TrainingSubnet" in json.dumps(resources["Subnets"])
    data = _one(template, "AWS::EC2::LaunchTemplate", "SingleNodeLaunchTemplate")["LaunchTemplateData"]
    assert "NetworkInterfaces" not in data


def test_config_sets_weights_spot_and_validation_instance():
    # Fair-share weights, on-demand validation and a smaller validation instance come from the config.
    template = _template(
        instance_type="g5.12xlarge",
        batch_research_weight="2.5",
        batch_production_weight="0.5",
        batch_single_node_spot="false",
        batch_single_node_instance_type="g5.xlarge",
    )
    (policy,) = _resources(template, "AWS::Batch::SchedulingPolicy").values()
    shares = {s["ShareIdentifier"]: s["WeightFactor"] for s in policy["FairsharePolicy"]["ShareDistribution"]}
    assert shares == {"research": 2.5, "production": 0.5}
    resources = _one(template, "AWS::Batch::ComputeEnvironment", "SingleNodeEnvironment")["ComputeResources"]
    assert resources["Type"] == "EC2" and resources["InstanceTypes"] == ["g5.xlarge"]
    assert not [k for k in _resources(template, "AWS::Batch::ComputeEnvironment") if "OnDemand" in k]
    validate = _one(template, "AWS::Batch::JobDefinition", "JobsValidateJobDefinition")["ContainerProperties"]
    assert {"Type": "GPU", "Value": "1"} in validate["ResourceRequirements"]


def test_vpc_default_group_opens_task_network_for_multi_node_jobs():
    # MNP containers get the VPC default group (Batch user guide, mnp-ce.html): all traffic in from and out to
    # itself, HTTPS out; nothing else.
    template = _batch()
    rules = {
        kind: [
            p
            for p in _resources(template, f"AWS::EC2::SecurityGroup{kind}").values()
            if "DefaultSecurityGroup" in json.dumps(p["GroupId"])
        ]
        for kind in ("Ingress", "Egress")
    }
    (ingress,) = rules["Ingress"]
    assert ingress["IpProtocol"] == "-1" and ingress["SourceSecurityGroupId"] == ingress["GroupId"]
    (to_itself,) = [r for r in rules["Egress"] if "DestinationSecurityGroupId" in r]
    assert to_itself["IpProtocol"] == "-1" and to_itself["DestinationSecurityGroupId"] == to_itself["GroupId"]
    (https,) = [r for r in rules["Egress"] if "CidrIp" in r]
    assert (https["IpProtocol"], https["FromPort"], https["ToPort"], https["CidrIp"]) == ("tcp", 443, 443, "0.0.0.0/0")
    assert len(rules["Egress"]) == 2


def test_queues_share_fairly_between_research_and_production():
    # Every queue uses the fair-share policy with the research and production shares.
    template = _batch()
    (policy_id,) = _resources(template, "AWS::Batch::SchedulingPolicy")
    shares = _resources(template, "AWS::Batch::SchedulingPolicy")[policy_id]["FairsharePolicy"]["ShareDistribution"]
    assert {s["ShareIdentifier"] for s in shares} == {"research", "production"}
    queues = _resources(template, "AWS::Batch::JobQueue").values()
    assert len(queues) == 3  # multi-node, single-node on Spot, single-node on-demand
    assert all(policy_id in json.dumps(q["SchedulingPolicyArn"]) for q in queues)


def _capacity_wait(queue: dict) -> int:
    (action,) = [
        a for a in queue["JobStateTimeLimitActions"] if a["Reason"] == "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"
    ]
    assert action["Action"] == "CANCEL" and action["State"] == "RUNNABLE"
    return action["MaxTimeSeconds"]


def test_jobs_starved_of_capacity_are_cancelled():
    # Hosts launched for a multi-node job idle while the rest never comes: cancel after the environment's
    # batch_capacity_wait_minutes (default 20), and let the pipeline ask again; a single-node job waits longer.
    template = _batch()
    assert _capacity_wait(_one(template, "AWS::Batch::JobQueue", "MultiNodeQueue")) == 20 * 60
    assert (
        _capacity_wait(_one(template, "AWS::Batch::JobQueue", "SingleNodeOnDemandQueue")) == CAPACITY_WAIT_MINUTES * 60
    )


def test_multi_node_hosts_launch_into_the_environments_reservation_without_a_placement_group_of_their_own():
    # AWS HPC blog, "How to use Capacity Blocks for ML with AWS Batch": the compute environment's launch template
    # carries the block's market type and target; the reservation places its instances (EC2 user guide, "Launch
    # instances into an existing Capacity Reservation"), so no cluster placement group is named.
    template = _template(instance_type="p5e.48xlarge", **{k: str(v) for k, v in CAPACITY_BLOCK.items()})
    multi = _one(template, "AWS::EC2::LaunchTemplate", "MultiNodeLaunchTemplate")["LaunchTemplateData"]
    assert multi["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": "cr-0123456789abcdef0"}
    }
    assert multi["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    single = _one(template, "AWS::EC2::LaunchTemplate", "SingleNodeLaunchTemplate")["LaunchTemplateData"]
    assert "CapacityReservationSpecification" not in single  # validation runs on its own type, outside it
    assert _resources(template, "AWS::EC2::PlacementGroup") == {}
    environment = _one(template, "AWS::Batch::ComputeEnvironment", "MultiNodeEnvironment")
    assert "PlacementGroup" not in environment["ComputeResources"]
    assert environment["ComputeResources"]["InstanceTypes"] == ["p5e.48xlarge"]


def test_the_multi_node_capacity_wait_is_the_environments():
    # JobStateTimeLimitActions is not create-only (AWS::Batch::JobQueue's resource schema): a change updates the queue.
    queue = _one(_template(batch_capacity_wait_minutes=45), "AWS::Batch::JobQueue", "MultiNodeQueue")
    assert _capacity_wait(queue) == 45 * 60


def test_job_role_is_limited_to_the_bucket_prefixes():
    # The job role: read datasets/ and models/ (the pipeline's), read-write checkpoints/ runs/, its log group; no
    # wildcard actions.
    (policy,) = [p for k, p in _resources(_batch(), "AWS::IAM::Policy").items() if k.startswith("JobRole")]
    statements = policy["PolicyDocument"]["Statement"]
    actions = [a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])]
    assert all("*" not in a for a in actions)
    writes = next(s for s in statements if "s3:PutObject" in s["Action"])
    assert sorted(json.dumps(r).split('"/')[1].split("*")[0] for r in writes["Resource"]) == ["checkpoints/", "runs/"]
    reads = next(s for s in statements if s["Action"] == "s3:GetObject")
    assert "datasets/" in json.dumps(reads["Resource"]) and "models/" in json.dumps(reads["Resource"])
    assert any("logs:PutLogEvents" in s["Action"] for s in statements)


def test_log_group_keeps_the_configured_retention():
    # Job logs: retention from config.log_retention_days (dev: 14), deleted with the dev stack.
    (group,) = [v for v in _batch()["Resources"].values() if v["Type"] == "AWS::Logs::LogGroup"]
    assert group["Properties"]["RetentionInDays"] == CDK_JSON_CONTEXT["environments"]["dev"]["log_retention_days"]
    assert group["DeletionPolicy"] == "Delete"


def test_outputs_and_attributes_for_the_pipeline():
    # Queue ARNs and job-definition names as outputs (submitted by name, a job runs the latest active revision:
    # Batch API reference, SubmitJob); the attributes the pipeline engineer builds on.
    outputs = _batch()["Outputs"]
    assert {
        "MultiNodeQueueArn",
        "SingleNodeQueueArn",
        "SanityJobDefinitionName",
        "TrainJobDefinitionName",
        "ValidateJobDefinitionName",
    } <= set(outputs)
    assert outputs["TrainJobDefinitionName"]["Value"] == "efa-training-dev-train"
    stack = _environment(instance_type="g5.12xlarge").compute()
    assert isinstance(stack.multi_node_queue, batch.JobQueue) and isinstance(stack.single_node_queue, batch.JobQueue)
    assert set(stack.job_definitions) == {"sanity", "train", "validate"}
    assert isinstance(stack.job_definitions["train"], batch.MultiNodeJobDefinition)
    assert stack.log_group is not None and stack.job_role is not None


def test_hosts_give_containers_the_stop_grace_for_a_final_checkpoint():
    # ECS's default 30 s between SIGTERM and SIGKILL is too short to save a large model; hosts raise it.
    user_data = json.dumps(_resources(_batch(), "AWS::EC2::LaunchTemplate"))
    assert f"ECS_CONTAINER_STOP_TIMEOUT={STOP_GRACE_SECONDS}s" in user_data


def test_a_deploy_never_cuts_a_training_attempt_short():
    # Batch API reference, UpdatePolicy: running jobs get jobExecutionTimeoutMinutes (default 30) before an
    # infrastructure update replaces their hosts. Every environment waits at least its longest job attempt.
    template = _template(instance_type="p5.48xlarge", batch_train_timeout_hours="120")
    attempts = {
        k: p["Timeout"]["AttemptDurationSeconds"] // 60
        for k, p in _resources(template, "AWS::Batch::JobDefinition").items()
    }
    train = next(v for k, v in attempts.items() if k.startswith("JobsTrain"))
    validate = next(v for k, v in attempts.items() if k.startswith("JobsValidate"))
    assert train == 7200
    environments = _resources(template, "AWS::Batch::ComputeEnvironment")
    assert len(environments) == 3
    for env_id, props in environments.items():
        policy = props["UpdatePolicy"]
        assert policy["TerminateJobsOnUpdate"] is False and props["ReplaceComputeEnvironment"] is False
        longest = train if env_id.startswith("MultiNode") else validate
        assert policy["JobExecutionTimeoutMinutes"] >= longest, env_id


def test_batch_containers_are_kept_from_the_instance_metadata():
    # ECS developer guide, "container instance security considerations": ECS_AWSVPC_BLOCK_IMDS keeps awsvpc
    # (multi-node) containers from the instance profile; hop limit 1 keeps bridge-mode (single-node) ones out.
    template = _batch("p5.48xlarge")
    for template_id in ("MultiNodeLaunchTemplate", "SingleNodeLaunchTemplate"):
        data = _one(template, "AWS::EC2::LaunchTemplate", template_id)["LaunchTemplateData"]
        assert "ECS_AWSVPC_BLOCK_IMDS=true" in json.dumps(data["UserData"])
        assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 1


# A replaced file system (new DNS and mount name) must reach every consumer in the same deploy: consumers read
# the names through Fn::GetStackOutput, which CloudFormation resolves only when the consumer itself is updated
# (CloudFormation template reference, "Fn::GetStackOutput"). The revision in their templates forces that update.
def test_replacing_the_file_system_changes_both_host_launch_templates():
    def user_data(**overrides: object) -> dict[str, str]:
        return {
            k: json.dumps(v["LaunchTemplateData"]["UserData"])
            for k, v in _resources(
                _template(instance_type="g5.12xlarge", **overrides), "AWS::EC2::LaunchTemplate"
            ).items()
        }

    before, after = user_data(), user_data(fsx_deployment_type="PERSISTENT_2", fsx_storage_gib="2400")
    assert before.keys() == after.keys() and len(before) == 2
    assert all(before[k] != after[k] for k in before)  # both host templates follow the producer
    assert all("StorageLustre" in v and "GetStackOutput" in v for v in after.values())

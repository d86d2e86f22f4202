"""The Batch backend, per catalogue EFA instance type (each variant synthesized once, shared with the gate tests)."""

import json
import os
import subprocess

import aws_cdk.aws_batch as batch
import pytest
from aws_cdk.assertions import Match

from config import CATALOGUE, ConfigError, efa_instance_types
from contracts.job_environment import STOP_GRACE_SECONDS
from stacks.batch_stack import CAPACITY_WAIT_MINUTES
from tests.conftest import CDK_JSON_CONTEXT, ROOT
from app import build_app

TYPES = efa_instance_types()
NODES = CDK_JSON_CONTEXT["environments"]["dev"]["nodes"]


def _variant(synth, name: str):
    return synth(compute="batch", instance_type=name)


def _resources(template: dict, kind: str) -> dict:
    return {k: v["Properties"] for k, v in template["Resources"].items() if v["Type"] == kind}


def _one(template: dict, kind: str, id_prefix: str) -> dict:
    (props,) = [p for k, p in _resources(template, kind).items() if k.startswith(id_prefix)]
    return props


def _batch(synth, name: str) -> dict:
    return _variant(synth, name).raw("compute")


@pytest.mark.parametrize("name", TYPES)
def test_launch_template_has_catalogue_efa_interfaces(synth, name):
    # Multi-node hosts: one interface per EFA card (0..n-1, device 0; efa then efa-only), the EFA group on each.
    template = _batch(synth, name)
    data = _one(template, "AWS::EC2::LaunchTemplate", "MultiNodeLaunchTemplate")["LaunchTemplateData"]
    interfaces = data["NetworkInterfaces"]
    count = CATALOGUE[name].efa_interfaces
    assert [i["NetworkCardIndex"] for i in interfaces] == list(range(count))
    assert {i["DeviceIndex"] for i in interfaces} == {0}
    assert [i["InterfaceType"] for i in interfaces] == ["efa"] + ["efa-only"] * (count - 1)
    groups = {json.dumps(i["Groups"]) for i in interfaces}
    assert len(groups) == 1 and "EfaSecurityGroup" in groups.pop()
    assert all("SubnetId" not in i for i in interfaces) and "SecurityGroupIds" not in data


@pytest.mark.parametrize("name", TYPES)
def test_placement_group_is_cluster(synth, name):
    # Every node of a job in one cluster placement group, referenced by the multi-node environment.
    template = _batch(synth, name)
    (group_id,) = _resources(template, "AWS::EC2::PlacementGroup")
    assert _resources(template, "AWS::EC2::PlacementGroup")[group_id]["Strategy"] == "cluster"
    resources = _one(template, "AWS::Batch::ComputeEnvironment", "MultiNodeEnvironment")["ComputeResources"]
    assert resources["PlacementGroup"] == {"Fn::GetAtt": [group_id, "GroupName"]}


@pytest.mark.parametrize("name", TYPES)
def test_multi_node_environment_is_on_demand_in_the_training_subnet(synth, name):
    # On-demand (EC2), the one training subnet, no SecurityGroupIds, 0..nodes x vCPUs, the catalogue's type.
    resources = _one(_batch(synth, name), "AWS::Batch::ComputeEnvironment", "MultiNodeEnvironment")["ComputeResources"]
    assert resources["Type"] == "EC2"
    (subnet,) = resources["Subnets"]
    assert "TrainingSubnet" in json.dumps(subnet)
    assert "SecurityGroupIds" not in resources
    assert resources["InstanceTypes"] == [name]
    assert resources["MinvCpus"] == 0 and resources["MaxvCpus"] == NODES * CATALOGUE[name].vcpus
    assert "LatestVersionNumber" in json.dumps(resources["LaunchTemplate"]["Version"])


@pytest.mark.parametrize("name", TYPES)
def test_multi_node_environment_uses_the_accelerator_image(synth, name):
    # GPU hosts: ECS_AL2023_NVIDIA; Neuron hosts: the ECS AL2023 Neuron AMI from its SSM parameter.
    template = _batch(synth, name)
    resources = _one(template, "AWS::Batch::ComputeEnvironment", "MultiNodeEnvironment")["ComputeResources"]
    (image,) = resources["Ec2Configuration"]
    assert image["ImageType"] == CATALOGUE[name].batch_image_type
    if CATALOGUE[name].accelerator.value == "neuron":
        parameter = image["ImageIdOverride"]["Ref"]
        assert template["Parameters"][parameter]["Default"] == \
            "/aws/service/ecs/optimized-ami/amazon-linux-2023/neuron/recommended/image_id"
    else:
        assert "ImageIdOverride" not in image


@pytest.mark.parametrize("name", TYPES)
def test_multi_node_jobs_map_every_efa_device_and_accelerator(synth, name):
    # sanity and train: uverbs0..n-1, every GPU (or /dev/neuron0..N-1), memlock unlimited, big /dev/shm, /fsx.
    template = _batch(synth, name)
    it = CATALOGUE[name]
    for job in ("Sanity", "Train"):
        props = _one(template, "AWS::Batch::JobDefinition", f"Jobs{job}JobDefinition")
        nodes = props["NodeProperties"]
        assert nodes["MainNode"] == 0 and nodes["NumNodes"] == NODES
        (node_range,) = nodes["NodeRangeProperties"]
        assert node_range["TargetNodes"] == f"0:{NODES - 1}"
        container = node_range["Container"]
        devices = [d["HostPath"] for d in container["LinuxParameters"]["Devices"]]
        assert [d for d in devices if "uverbs" in d] == [f"/dev/infiniband/uverbs{i}" for i in range(it.efa_interfaces)]
        requirements = {r["Type"]: r["Value"] for r in container["ResourceRequirements"]}
        if it.accelerator.value == "nvidia":
            assert requirements["GPU"] == str(it.accelerators)
        else:
            assert "GPU" not in requirements
            assert [d for d in devices if "neuron" in d] == [f"/dev/neuron{i}" for i in range(it.accelerators)]
        assert container["Ulimits"] == [{"Name": "memlock", "SoftLimit": -1, "HardLimit": -1}]
        assert container["LinuxParameters"]["SharedMemorySize"] >= 16 * 1024
        assert container["Volumes"] == [{"Name": "fsx", "Host": {"SourcePath": "/fsx"}}]
        assert container["MountPoints"] == [{"ContainerPath": "/fsx", "SourceVolume": "fsx"}]
        env = {e["Name"]: e["Value"] for e in container["Environment"]}
        assert env["ACCELERATORS_PER_NODE"] == str(it.workers_per_node)
        assert env["EXPECTED_BUSBW_GBPS"] == f"{it.expected_busbw_gbps:g}" and env["FSX_MOUNT"] == "/fsx"
        assert env["ACCELERATOR_KIND"] == ("gpu" if it.accelerator.value == "nvidia" else "neuron")
        assert dict(it.collective_env).items() <= env.items()


@pytest.mark.parametrize("name", TYPES)
def test_retry_rules_retry_infrastructure_and_end_in_exit(synth, name):
    # Retry host loss and launch failures, EXIT on the application's exit codes, final EXIT on "*"; <=5 rules.
    for props in _resources(_batch(synth, name), "AWS::Batch::JobDefinition").values():
        strategy = props["RetryStrategy"]
        rules = strategy["EvaluateOnExit"]
        assert 1 <= strategy["Attempts"] <= 10 and len(rules) <= 5
        assert rules[0] == {"Action": "RETRY", "OnStatusReason": "Host EC2*"}
        assert {"Action": "RETRY", "OnReason": "CannotPullContainerError*"} in rules
        assert {"Action": "RETRY", "OnStatusReason": "Task failed to start*"} in rules
        assert rules[-2] == {"Action": "EXIT", "OnExitCode": "*"}
        assert rules[-1] == {"Action": "EXIT", "OnReason": "*"}
        assert props["Timeout"]["AttemptDurationSeconds"] >= 3600


def test_every_placeholder_has_a_default(synth):
    # Each Ref::name of a command has a default parameter, so a bare submit-job runs a valid command.
    for props in _resources(_batch(synth, "p5.48xlarge"), "AWS::Batch::JobDefinition").values():
        container = props.get("ContainerProperties") or props["NodeProperties"]["NodeRangeProperties"][0]["Container"]
        refs = {arg[len("Ref::"):] for arg in container["Command"] if isinstance(arg, str) and arg.startswith("Ref::")}
        assert refs and refs <= set(props["Parameters"])


def test_commands_follow_the_image_contract(synth):
    # Mode first (launch.py's argv[1]); per-run values only as whole arguments.
    template = _batch(synth, "p5.48xlarge")
    train = _one(template, "AWS::Batch::JobDefinition", "JobsTrainJobDefinition")
    command = train["NodeProperties"]["NodeRangeProperties"][0]["Container"]["Command"]
    assert command[0] == "train"
    assert command[command.index("--run-id") + 1] == "Ref::run_id"
    assert command[command.index("--dataset") + 1] == "Ref::dataset"
    sanity = _one(template, "AWS::Batch::JobDefinition", "JobsSanityJobDefinition")
    command = sanity["NodeProperties"]["NodeRangeProperties"][0]["Container"]["Command"]
    # 80% of the published two-node figure at 2 GiB (443.7 GB/s, catalogue busbw_source), not a loose floor.
    assert command[:3] == ["sanity", "--min-busbw-gbps", "355"]
    validate = _one(template, "AWS::Batch::JobDefinition", "JobsValidateJobDefinition")
    assert validate["ContainerProperties"]["Command"][0] == "validate"
    for props in _resources(template, "AWS::Batch::JobDefinition").values():
        container = props.get("ContainerProperties") or props["NodeProperties"]["NodeRangeProperties"][0]["Container"]
        assert all(arg.startswith("Ref::") or "Ref::" not in arg for arg in container["Command"] if isinstance(arg, str))


def test_single_node_environment_is_spot_with_security_groups(synth):
    # Validation hosts: Spot by default on the catalogue's small type, the same subnet, no EFA interfaces,
    # security groups on the environment; an on-demand twin for when Spot capacity is short.
    template = _batch(synth, "g5.12xlarge")
    resources = _one(template, "AWS::Batch::ComputeEnvironment", "SingleNodeEnvironment")["ComputeResources"]
    assert resources["Type"] == "SPOT" and resources["InstanceTypes"] == ["g5.xlarge"]
    on_demand = _one(template, "AWS::Batch::ComputeEnvironment", "SingleNodeOnDemandEnvironment")["ComputeResources"]
    assert on_demand["Type"] == "EC2" and on_demand["InstanceTypes"] == ["g5.xlarge"]
    assert len(resources["SecurityGroupIds"]) == 1 and "PlacementGroup" not in resources
    assert "TrainingSubnet" in json.dumps(resources["Subnets"])
    data = _one(template, "AWS::EC2::LaunchTemplate", "SingleNodeLaunchTemplate")["LaunchTemplateData"]
    assert "NetworkInterfaces" not in data


def test_config_sets_weights_spot_and_validation_instance(synth):
    # Fair-share weights, on-demand validation and a smaller validation instance come from the config.
    template = synth(compute="batch", instance_type="g5.12xlarge", batch_research_weight="2.5",
                     batch_production_weight="0.5", batch_single_node_spot="false",
                     batch_single_node_instance_type="g5.xlarge").raw("compute")
    (policy,) = _resources(template, "AWS::Batch::SchedulingPolicy").values()
    shares = {s["ShareIdentifier"]: s["WeightFactor"] for s in policy["FairsharePolicy"]["ShareDistribution"]}
    assert shares == {"research": 2.5, "production": 0.5}
    resources = _one(template, "AWS::Batch::ComputeEnvironment", "SingleNodeEnvironment")["ComputeResources"]
    assert resources["Type"] == "EC2" and resources["InstanceTypes"] == ["g5.xlarge"]
    validate = _one(template, "AWS::Batch::JobDefinition", "JobsValidateJobDefinition")["ContainerProperties"]
    assert {"Type": "GPU", "Value": "1"} in validate["ResourceRequirements"]


def test_vpc_default_group_opens_task_network_for_multi_node_jobs(synth):
    # MNP containers get the VPC default group: all traffic in from and out to itself, HTTPS out; nothing else.
    template = _batch(synth, "g5.12xlarge")
    rules = {kind: [p for p in _resources(template, f"AWS::EC2::SecurityGroup{kind}").values()
                    if "DefaultSecurityGroup" in json.dumps(p["GroupId"])] for kind in ("Ingress", "Egress")}
    (ingress,) = rules["Ingress"]
    assert ingress["IpProtocol"] == "-1" and ingress["SourceSecurityGroupId"] == ingress["GroupId"]
    (to_itself,) = [r for r in rules["Egress"] if "DestinationSecurityGroupId" in r]
    assert to_itself["IpProtocol"] == "-1" and to_itself["DestinationSecurityGroupId"] == to_itself["GroupId"]
    (https,) = [r for r in rules["Egress"] if "CidrIp" in r]
    assert (https["IpProtocol"], https["FromPort"], https["ToPort"], https["CidrIp"]) == ("tcp", 443, 443, "0.0.0.0/0")
    assert len(rules["Egress"]) == 2


def test_queues_share_fairly_between_research_and_production(synth):
    # Both queues use the fair-share policy with the research and production shares.
    template = _batch(synth, "g5.12xlarge")
    (policy_id,) = _resources(template, "AWS::Batch::SchedulingPolicy")
    shares = _resources(template, "AWS::Batch::SchedulingPolicy")[policy_id]["FairsharePolicy"]["ShareDistribution"]
    assert {s["ShareIdentifier"] for s in shares} == {"research", "production"}
    queues = _resources(template, "AWS::Batch::JobQueue").values()
    assert len(queues) == 3  # multi-node, single-node on Spot, single-node on-demand
    assert all(policy_id in json.dumps(q["SchedulingPolicyArn"]) for q in queues)


def test_job_role_is_limited_to_the_bucket_prefixes(synth):
    # The job role: read datasets/, read-write checkpoints/ models/ runs/, its log group; no wildcard actions.
    template = _batch(synth, "g5.12xlarge")
    (policy,) = [p for k, p in _resources(template, "AWS::IAM::Policy").items() if k.startswith("JobRole")]
    statements = policy["PolicyDocument"]["Statement"]
    actions = [a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])]
    assert all("*" not in a for a in actions)
    writes = next(s for s in statements if "s3:PutObject" in s["Action"])
    assert sorted(json.dumps(r).split('"/')[1].split('*')[0] for r in writes["Resource"]) == \
        ["checkpoints/", "models/", "runs/"]
    reads = next(s for s in statements if s["Action"] == "s3:GetObject")
    assert "datasets/" in json.dumps(reads["Resource"])


def test_log_group_keeps_the_configured_retention(synth):
    # Job logs: retention from config.log_retention_days (dev: 14), deleted with the dev stack.
    template = _batch(synth, "g5.12xlarge")
    (group,) = [v for v in template["Resources"].values() if v["Type"] == "AWS::Logs::LogGroup"]
    assert group["Properties"]["RetentionInDays"] == CDK_JSON_CONTEXT["environments"]["dev"]["log_retention_days"]
    assert group["DeletionPolicy"] == "Delete"


def test_outputs_and_attributes_for_the_pipeline(synth):
    # Queue and job-definition ARNs as outputs; the attributes the pipeline engineer builds on.
    synthesized = _variant(synth, "g5.12xlarge")
    outputs = synthesized.raw("compute")["Outputs"]
    assert {"MultiNodeQueueArn", "SingleNodeQueueArn", "SanityJobDefinitionArn", "TrainJobDefinitionArn",
            "ValidateJobDefinitionArn"} <= set(outputs)
    stack = synthesized.stacks["compute"]
    assert isinstance(stack.multi_node_queue, batch.JobQueue) and isinstance(stack.single_node_queue, batch.JobQueue)
    assert set(stack.job_definitions) == {"sanity", "train", "validate"}
    assert isinstance(stack.job_definitions["train"], batch.MultiNodeJobDefinition)
    assert stack.log_group is not None and stack.job_role is not None


def test_instance_without_efa_is_refused_in_process():
    # build_app refuses g5.xlarge (no EFA) before building anything, naming the field and the allowed types.
    with pytest.raises(ConfigError, match=r"instance_type='g5.xlarge' is not valid; expected an instance type with EFA"):
        build_app(context={**CDK_JSON_CONTEXT, "compute": "batch", "instance_type": "g5.xlarge"})


@pytest.mark.slow
def test_instance_without_efa_is_refused_by_the_cli(tmp_path):
    # The real CLI: non-zero exit, the one-line message on stderr, no traceback.
    env = {**os.environ, "PATH": f"{ROOT / 'node_modules' / '.bin'}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        [str(ROOT / "node_modules" / ".bin" / "cdk"), "synth", "--no-notices", "-o", str(tmp_path / "out"),
         "-c", "compute=batch", "-c", "instance_type=g5.xlarge"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode != 0
    assert "error: environment 'dev': instance_type='g5.xlarge' is not valid" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("instance_type", efa_instance_types())
def test_jobs_take_mfu_peak_from_the_catalogue(synth, instance_type):
    # MFU's denominator is the catalogue's peak, passed to the image, not the image's own guess by device name.
    compute = synth(compute="batch", instance_type=instance_type).template("compute")
    training = CATALOGUE[instance_type]
    for definition in compute.find_resources("AWS::Batch::JobDefinition").values():
        props = definition["Properties"]
        multi_node = "NodeProperties" in props
        container = props["NodeProperties"]["NodeRangeProperties"][0]["Container"] if multi_node \
            else props["ContainerProperties"]
        host = training if multi_node else CATALOGUE[training.validation_instance_type]  # validation's own host
        peak = f"{host.peak_bf16_tflops_per_accelerator:g}"
        assert {"Name": "PEAK_TFLOPS_PER_ACCELERATOR", "Value": peak} in container["Environment"]


def test_hosts_give_containers_the_stop_grace_for_a_final_checkpoint(synth):
    # ECS's default 30 s between SIGTERM and SIGKILL is too short to save a large model; hosts raise it.
    user_data = json.dumps(synth(compute="batch").template("compute").find_resources("AWS::EC2::LaunchTemplate"))
    assert f"ECS_CONTAINER_STOP_TIMEOUT={STOP_GRACE_SECONDS}s" in user_data


def test_torchrun_waits_for_workers_within_the_stop_grace(synth):
    # torchrun must stop waiting for its workers' checkpoint before the container is killed.
    compute = synth(compute="batch").template("compute")
    for definition in compute.find_resources("AWS::Batch::JobDefinition").values():
        props = definition["Properties"]
        container = (props["NodeProperties"]["NodeRangeProperties"][0]["Container"] if "NodeProperties" in props
                     else props["ContainerProperties"])
        env = {item["Name"]: item["Value"] for item in container["Environment"]}
        assert 30 < int(env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]) < STOP_GRACE_SECONDS


def test_jobs_starved_of_capacity_are_cancelled(synth):
    # Hosts launched for a multi-node job idle while the rest never comes: cancel, and let the pipeline retry.
    synth(compute="batch").template("compute").has_resource_properties("AWS::Batch::JobQueue", {
        "JobStateTimeLimitActions": Match.array_with([{
            "Action": "CANCEL", "MaxTimeSeconds": CAPACITY_WAIT_MINUTES * 60, "Reason": "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY",
            "State": "RUNNABLE"}])})


@pytest.mark.parametrize("name", TYPES)
def test_multi_node_jobs_pin_the_bootstrap_to_the_task_interface(synth, name):
    # awsvpc containers also see ecs-eth0 (link-local, to the ECS agent): an exclusion list could pick it, so
    # NCCL matches eth0 exactly ("=eth0", NCCL environment variables) and Gloo is told eth0 too.
    for props in _resources(_batch(synth, name), "AWS::Batch::JobDefinition").values():
        if "NodeProperties" not in props:
            continue
        container = props["NodeProperties"]["NodeRangeProperties"][0]["Container"]
        env = {e["Name"]: e["Value"] for e in container["Environment"]}
        assert env["NCCL_SOCKET_IFNAME"] == "=eth0" and env["GLOO_SOCKET_IFNAME"] == "eth0"


def test_a_deploy_never_cuts_a_training_attempt_short(synth):
    # Batch API reference, UpdatePolicy: running jobs get jobExecutionTimeoutMinutes (default 30) before an
    # infrastructure update replaces their hosts. Every environment waits at least its longest job attempt.
    template = synth(compute="batch", instance_type="p5.48xlarge", batch_train_timeout_hours="120").raw("compute")
    attempts = {k: p["Timeout"]["AttemptDurationSeconds"] // 60
                for k, p in _resources(template, "AWS::Batch::JobDefinition").items()}
    train = next(v for k, v in attempts.items() if k.startswith("JobsTrain"))
    validate = next(v for k, v in attempts.items() if k.startswith("JobsValidate"))
    assert train == 7200
    for env_id, props in _resources(template, "AWS::Batch::ComputeEnvironment").items():
        policy = props["UpdatePolicy"]
        assert policy["TerminateJobsOnUpdate"] is False and props["ReplaceComputeEnvironment"] is False
        longest = train if env_id.startswith("MultiNode") else validate
        assert policy["JobExecutionTimeoutMinutes"] >= longest, env_id


def test_training_timeout_beyond_what_an_update_can_wait_fails_at_synth():
    # 121 hours could not be covered by UpdatePolicy's 7200-minute maximum: one line at synth, not a cut attempt.
    with pytest.raises(ConfigError, match=r"batch_train_timeout_hours=121 is not valid; expected .* 1 to 120"):
        build_app(context={**CDK_JSON_CONTEXT, "batch_train_timeout_hours": "121"})


@pytest.mark.parametrize("name", TYPES)
def test_validation_job_takes_one_accelerator_of_a_small_instance(synth, name):
    # One GPU (or one Trainium device) on the catalogue's single-accelerator type of the same family.
    template = _batch(synth, name)
    small = CATALOGUE[CATALOGUE[name].validation_instance_type]
    assert small.single_node_only and small.accelerators == 1 and small.accelerator is CATALOGUE[name].accelerator
    validate = _one(template, "AWS::Batch::JobDefinition", "JobsValidateJobDefinition")["ContainerProperties"]
    requirements = {r["Type"]: r["Value"] for r in validate["ResourceRequirements"]}
    devices = [d["HostPath"] for d in validate.get("LinuxParameters", {}).get("Devices", [])]
    if small.accelerator.value == "nvidia":
        assert requirements["GPU"] == "1" and not devices
    else:
        assert "GPU" not in requirements and devices == ["/dev/neuron0"]
    env = {e["Name"]: e["Value"] for e in validate["Environment"]}
    assert not {k for k in env if k.startswith(("FI_", "NCCL_SOCKET", "GLOO_SOCKET"))}
    for env_id in ("SingleNodeEnvironment", "SingleNodeOnDemandEnvironment"):
        resources = _one(template, "AWS::Batch::ComputeEnvironment", env_id)["ComputeResources"]
        assert resources["InstanceTypes"] == [small.name]


def test_batch_containers_are_kept_from_the_instance_metadata(synth):
    # ECS developer guide, "container instance security considerations": ECS_AWSVPC_BLOCK_IMDS keeps awsvpc
    # (multi-node) containers from the instance profile; hop limit 1 keeps bridge-mode (single-node) ones out.
    template = _batch(synth, "p5.48xlarge")
    for template_id in ("MultiNodeLaunchTemplate", "SingleNodeLaunchTemplate"):
        data = _one(template, "AWS::EC2::LaunchTemplate", template_id)["LaunchTemplateData"]
        assert "ECS_AWSVPC_BLOCK_IMDS=true" in json.dumps(data["UserData"])
        assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 1


def test_every_job_names_its_environment_for_the_metrics(synth):
    # The Environment dimension of the training metrics, which the alarms and the dashboard filter on.
    for props in _resources(_batch(synth, "g5.12xlarge"), "AWS::Batch::JobDefinition").values():
        container = props["NodeProperties"]["NodeRangeProperties"][0]["Container"] if "NodeProperties" in props \
            else props["ContainerProperties"]
        assert {"Name": "TRAINING_ENVIRONMENT", "Value": "dev"} in container["Environment"]

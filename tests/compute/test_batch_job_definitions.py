"""BatchJobDefinitions alone, in a bare stack, per catalogue EFA instance type: multi-node "sanity" and "train" on every
EFA device and accelerator of a node, single-node "validate" on one accelerator, the image's command contract."""

import functools

import aws_cdk as cdk
import aws_cdk.aws_ecs as ecs
import aws_cdk.aws_iam as iam
import aws_cdk.aws_logs as logs
import pytest

from config import CATALOGUE, Accelerator, efa_instance_types
from constructs.compute.batch.job_definitions import BatchJobDefinitions, job_specs
from contracts.job_environment import STOP_GRACE_SECONDS
from contracts.run import stages
from tests.alone import template_of

TYPES = efa_instance_types()
NEURON = [n for n in TYPES if CATALOGUE[n].accelerator is Accelerator.NEURON]
NVIDIA = [n for n in TYPES if CATALOGUE[n].accelerator is Accelerator.NVIDIA]
NODES = 2
FLAGS = "--model-type=transformer -O1"


@functools.cache
def _definitions(
    name: str, single_node: str | None = None, train_hours: int = 72, tracking_uri: str = ""
) -> dict[str, dict]:
    """Job name ("sanity", "train", "validate") -> its AWS::Batch::JobDefinition properties."""
    stack = cdk.Stack()
    instance = CATALOGUE[name]
    BatchJobDefinitions(
        stack,
        "Jobs",
        instance=instance,
        single_node_instance=CATALOGUE[single_node or instance.validation_instance_type or name],
        nodes=NODES,
        image=ecs.ContainerImage.from_registry("training:v1"),
        job_role=iam.Role(stack, "JobRole", assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com")),
        log_group=logs.LogGroup(stack, "JobLogs"),
        bucket_name="data-bucket",
        train_timeout=cdk.Duration.hours(train_hours),
        environment="dev",
        neuron_cc_flags=FLAGS,
        tracking_uri=tracking_uri,
    )
    resources = template_of(stack)["Resources"]
    return {
        job: next(
            r["Properties"]
            for k, r in resources.items()
            if r["Type"] == "AWS::Batch::JobDefinition" and k.startswith(f"Jobs{job.capitalize()}")
        )
        for job in ("sanity", "compile", "train", "validate")
        if job != "compile" or instance.accelerator is Accelerator.NEURON
    }


def _container(props: dict) -> dict:
    return (
        props["NodeProperties"]["NodeRangeProperties"][0]["Container"]
        if "NodeProperties" in props
        else props["ContainerProperties"]
    )


def _environment(props: dict) -> dict[str, str]:
    return {e["Name"]: e["Value"] for e in _container(props)["Environment"]}


@pytest.mark.parametrize("name", TYPES)
def test_multi_node_jobs_map_every_efa_device_and_accelerator(name):
    # sanity and train: uverbs0..n-1, every GPU (or /dev/neuron0..N-1), memlock unlimited, big /dev/shm, /fsx.
    it = CATALOGUE[name]
    for job in ("sanity", "train"):
        props = _definitions(name)[job]
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
        # /fsx read-only but for the folders a job writes (config/layout.py FSX_WRITABLE), and the host's instance id
        # read-only (a bad-host record names it: runtime/bad_hosts.py)
        writable = ("checkpoints", "runs", "neuron-cache")
        assert container["Volumes"] == [
            {"Name": "fsx", "Host": {"SourcePath": "/fsx"}},
            *({"Name": f"fsx-{w}", "Host": {"SourcePath": f"/fsx/{w}"}} for w in writable),
            {"Name": "host-identity", "Host": {"SourcePath": "/var/lib/efa-training"}},
        ]
        assert container["MountPoints"] == [
            {"ContainerPath": "/fsx", "ReadOnly": True, "SourceVolume": "fsx"},
            *({"ContainerPath": f"/fsx/{w}", "SourceVolume": f"fsx-{w}"} for w in writable),
            {"ContainerPath": "/etc/efa-training/host", "ReadOnly": True, "SourceVolume": "host-identity"},
        ]
        env = _environment(props)
        assert env["ACCELERATORS_PER_NODE"] == str(it.workers_per_node)
        assert env["EXPECTED_BUSBW_GBPS"] == f"{it.expected_busbw_gbps:g}" and env["FSX_MOUNT"] == "/fsx"
        assert env["INSTANCE_ID_FILE"] == "/etc/efa-training/host/instance-id"
        assert env["REPORT_PREFIX"].startswith("s3://") and env["REPORT_PREFIX"].endswith("/runs/")
        assert env["ACCELERATOR_KIND"] == ("gpu" if it.accelerator.value == "nvidia" else "neuron")
        assert dict(it.collective_env).items() <= env.items()


@pytest.mark.parametrize("name", TYPES)
def test_retry_rules_retry_infrastructure_and_end_in_exit(name):
    # Retry host loss and launch failures, EXIT on the application's exit codes, final EXIT on "*"; <=5 rules
    # (Batch evaluates at most 5: API_EvaluateOnExit).
    for props in _definitions(name).values():
        strategy = props["RetryStrategy"]
        rules = strategy["EvaluateOnExit"]
        assert 1 <= strategy["Attempts"] <= 10 and len(rules) <= 5
        assert rules[0] == {"Action": "RETRY", "OnStatusReason": "Host EC2*"}
        assert {"Action": "RETRY", "OnReason": "CannotPullContainerError*"} in rules
        assert {"Action": "RETRY", "OnStatusReason": "Task failed to start*"} in rules
        assert rules[-2] == {"Action": "EXIT", "OnExitCode": "*"}
        assert rules[-1] == {"Action": "EXIT", "OnReason": "*"}
        assert props["Timeout"]["AttemptDurationSeconds"] >= 3600


def test_every_placeholder_has_a_default():
    # Each Ref::name of a command has a default parameter, so a bare submit-job runs a valid command (Batch user
    # guide, "Parameter substitution").
    for props in _definitions("p5.48xlarge").values():
        command = _container(props)["Command"]
        refs = {arg[len("Ref::") :] for arg in command if isinstance(arg, str) and arg.startswith("Ref::")}
        assert refs and refs <= set(props["Parameters"])


def test_commands_follow_the_image_contract():
    # Mode first (launch.py's argv[1]); per-run values only as whole arguments (Batch substitutes only those).
    jobs = _definitions("p5.48xlarge")
    command = _container(jobs["train"])["Command"]
    assert command[0] == "train"
    assert command[command.index("--run-id") + 1] == "Ref::run_id"
    assert command[command.index("--dataset") + 1] == "Ref::dataset"
    # 80% of the published two-node figure at 2 GiB (443.7 GB/s, catalogue busbw_source), not a loose floor.
    assert _container(jobs["sanity"])["Command"][:3] == ["sanity", "--min-busbw-gbps", "355"]
    assert _container(jobs["validate"])["Command"][0] == "validate"
    for props in jobs.values():
        arguments = [arg for arg in _container(props)["Command"] if isinstance(arg, str)]
        assert all(arg.startswith("Ref::") or "Ref::" not in arg for arg in arguments)


@pytest.mark.parametrize("name", TYPES)
def test_jobs_take_mfu_peak_and_each_workers_memory_from_the_catalogue(name):
    # MFU's denominator is the catalogue's peak, passed to the image, not the image's own guess by device name; the
    # built-in trainer's memory estimate is held to a worker's memory (workloads/gpt/preflight.py): a GPU's, or a
    # NeuronCore's share of its chip's.
    training = CATALOGUE[name]
    for props in _definitions(name).values():
        host = training if "NodeProperties" in props else CATALOGUE[training.validation_instance_type]
        environment = _container(props)["Environment"]
        assert {
            "Name": "PEAK_TFLOPS_PER_ACCELERATOR",
            "Value": f"{host.peak_bf16_tflops_per_accelerator:g}",
        } in environment
        memory = f"{host.accelerator_memory_gb / host.cores_per_accelerator:g}"
        assert {"Name": "ACCELERATOR_MEMORY_GB", "Value": memory} in environment


def test_torchrun_waits_for_workers_within_the_stop_grace():
    # torchrun must stop waiting for its workers' checkpoint before the container is killed.
    for props in _definitions("g5.12xlarge").values():
        assert 30 < int(_environment(props)["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]) < STOP_GRACE_SECONDS


@pytest.mark.parametrize("name", TYPES)
def test_multi_node_jobs_pin_the_bootstrap_to_the_task_interface(name):
    # awsvpc containers also see ecs-eth0 (link-local, to the ECS agent): an exclusion list could pick it, so
    # NCCL matches eth0 exactly ("=eth0", NCCL environment variables) and Gloo is told eth0 too.
    for job in ("sanity", "train"):
        env = _environment(_definitions(name)[job])
        assert env["NCCL_SOCKET_IFNAME"] == "=eth0" and env["GLOO_SOCKET_IFNAME"] == "eth0"


@pytest.mark.parametrize("name", TYPES)
def test_validation_job_takes_one_accelerator_of_a_small_instance(name):
    # One GPU (or one Trainium device) on the catalogue's single-accelerator type of the same family.
    small = CATALOGUE[CATALOGUE[name].validation_instance_type]
    assert small.single_node_only and small.accelerators == 1 and small.accelerator is CATALOGUE[name].accelerator
    validate = _container(_definitions(name)["validate"])
    requirements = {r["Type"]: r["Value"] for r in validate["ResourceRequirements"]}
    devices = [d["HostPath"] for d in validate.get("LinuxParameters", {}).get("Devices", [])]
    if small.accelerator.value == "nvidia":
        assert requirements["GPU"] == "1" and not devices
    else:
        assert "GPU" not in requirements and devices == ["/dev/neuron0"]
    env = {e["Name"]: e["Value"] for e in validate["Environment"]}
    assert not {k for k in env if k.startswith(("FI_", "NCCL_SOCKET", "GLOO_SOCKET"))}


def test_a_configured_validation_instance_gets_one_accelerator():
    # batch_single_node_instance_type: validation runs on that type, still on one accelerator.
    validate = _container(_definitions("g5.12xlarge", single_node="g5.xlarge")["validate"])
    assert {"Type": "GPU", "Value": "1"} in validate["ResourceRequirements"]


def test_every_job_names_its_environment_for_the_metrics():
    # The Environment dimension of the training metrics, which the alarms and the dashboard filter on.
    for props in _definitions("g5.12xlarge").values():
        assert {"Name": "TRAINING_ENVIRONMENT", "Value": "dev"} in _container(props)["Environment"]


def test_attempt_timeouts_follow_the_training_timeout():
    # 120 hours of training: the train attempt may run 7200 minutes (the most a Batch update waits for).
    jobs = _definitions("p5.48xlarge", train_hours=120)
    assert jobs["train"]["Timeout"]["AttemptDurationSeconds"] == 7200 * 60
    assert jobs["validate"]["Timeout"]["AttemptDurationSeconds"] == stages(120)["validate"].attempt_seconds


@pytest.mark.parametrize("name", ["p5.48xlarge", "trn1.32xlarge"])
def test_job_definitions_read_the_stage_table(name):
    # contracts/run.py's stages give every job its attempt timeout and attempts (the pipeline's states read it too).
    specs = job_specs(instance=CATALOGUE[name], nodes=2, bucket_name="b", train_timeout=cdk.Duration.hours(24))
    for job, spec in specs.items():
        stage = stages(24)[job]
        assert (spec.timeout.to_seconds(), spec.attempts) == (stage.attempt_seconds, stage.attempts)


@pytest.mark.parametrize("name", NEURON)
def test_trainium_compiles_with_the_training_flags(name):
    # Trainium compiles ahead of time (training_image/efa_training/runtime/launch/neuron_compile.py) with the training's
    # own flags.
    specs = job_specs(instance=CATALOGUE[name], nodes=2, bucket_name="b", train_timeout=cdk.Duration.hours(24))
    assert specs["compile"].command == ["compile", *specs["train"].flags]


@pytest.mark.parametrize("name", NVIDIA)
def test_gpus_have_no_compile_job_and_no_compiler_flags(name):
    specs = job_specs(instance=CATALOGUE[name], nodes=2, bucket_name="b", train_timeout=cdk.Duration.hours(24))
    assert "compile" not in specs
    assert "NEURON_CC_FLAGS" not in _environment(_definitions(name)["train"])


@pytest.mark.parametrize("name", NEURON)
def test_trainiums_compile_and_train_jobs_share_the_compiler_flags_on_the_training_nodes(name):
    # The compile job fills the cache for NEURON_CC_FLAGS; training with other flags would miss every entry.
    definitions = _definitions(name)
    compile_job, train = definitions["compile"], definitions["train"]
    assert _environment(compile_job)["NEURON_CC_FLAGS"] == _environment(train)["NEURON_CC_FLAGS"] == FLAGS
    assert compile_job["NodeProperties"]["NumNodes"] == NODES and _container(compile_job)["Command"][0] == "compile"


def test_each_definition_has_the_fixed_name_the_pipeline_submits():
    # JobDefinitionName is the type's only create-only property (its CloudFormation resource schema): a changed
    # definition is a new revision of the same name, which SubmitJob without a revision runs (Batch API reference).
    names = {job: props["JobDefinitionName"] for job, props in _definitions("trn1.32xlarge").items()}
    assert names == {job: f"efa-training-dev-{job}" for job in ("sanity", "compile", "train", "validate")}

"""The Batch hosts' preparation alone: the host script (FSx mount, huge pages, accelerator check) and the CloudWatch
agent's configuration (the metrics the dashboard and the idle alarm read)."""

import subprocess

from config import CATALOGUE
from config.layout import HOST_IDENTITY_DIR, HOST_SETUP_FAILED
from constructs.compute.batch.host_user_data import HOST_METRICS_SOURCE, cloudwatch_agent_config, host_commands


def test_host_script_mounts_fsx_and_checks_accelerators():
    # The host script: Lustre client, the documented mount, huge pages, nvidia-smi GPU count.
    script = "\n".join(
        host_commands(
            instance=CATALOGUE["p5.48xlarge"], fsx_dns_name="fs.example", fsx_mount_name="abc", environment="dev"
        )
    )
    assert "dnf install -y lustre-client" in script
    assert "mount -t lustre -o relatime,flock fs.example@tcp:/abc /fsx" in script
    assert "vm.nr_hugepages" in script
    assert 'if [ "$GPUS" -ne 8 ]' in script and "-lt 32" in script


def test_the_host_hands_its_instance_id_to_its_containers():
    # Containers cannot reach the metadata service (hop limit 1): the host writes its id where the job definitions
    # mount it read-only (config.layout HOST_IDENTITY_DIR), for a bad-host record the pipeline terminates.
    script = "\n".join(
        host_commands(instance=CATALOGUE["p5.48xlarge"], fsx_dns_name="d", fsx_mount_name="m", environment="dev")
    )
    assert "latest/meta-data/instance-id > /var/lib/efa-training/instance-id" in script
    assert script.index("instance-id") < script.index("lustre-client")  # before any step that may fail


def test_neuron_host_checks_neuron_devices():
    # Trainium hosts count /dev/neuron* and run neuron-ls instead of nvidia-smi.
    script = "\n".join(
        host_commands(instance=CATALOGUE["trn1.32xlarge"], fsx_dns_name="d", fsx_mount_name="m", environment="dev")
    )
    own = script.split("<<'HOSTMETRICS'")[0]  # the host's commands, not the exporter's text (it has a GPU source too)
    assert "neuron-ls" in own and "nvidia-smi" not in own and "-ne 16" in own


def test_cloudwatch_agent_publishes_gpu_metrics_to_cwagent():
    # The dashboard reads nvidia_smi_utilization_gpu / nvidia_smi_memory_used in CWAgent.
    config = cloudwatch_agent_config(CATALOGUE["p4d.24xlarge"], "dev")
    assert config["metrics"]["namespace"] == "CWAgent"
    gpu = config["metrics"]["metrics_collected"]["nvidia_gpu"]["measurement"]
    assert {"utilization_gpu", "memory_used"} <= set(gpu)
    neuron = cloudwatch_agent_config(CATALOGUE["trn1.32xlarge"], "dev")
    assert "nvidia_gpu" not in neuron["metrics"]["metrics_collected"]


def test_cloudwatch_agent_tags_gpu_metrics_with_the_environment():
    # The nvidia_gpu section appends Environment=<env> (a section's append_dimensions, CloudWatch agent
    # configuration file reference), the dimension the dashboard and the idle alarm filter on.
    gpu = cloudwatch_agent_config(CATALOGUE["p5.48xlarge"], "prod")["metrics"]["metrics_collected"]["nvidia_gpu"]
    assert gpu["append_dimensions"] == {"Environment": "prod"}


def _neuron_script(environment: str = "prod") -> str:
    return "\n".join(
        host_commands(
            instance=CATALOGUE["trn1.32xlarge"], fsx_dns_name="d", fsx_mount_name="m", environment=environment
        )
    )


def test_neuron_host_runs_the_projects_exporter_for_this_environment():
    # A service runs training_image/efa_training/runtime/host_metrics.py on neuron-monitor's JSON and sends this
    # environment's per-host
    # utilisation to the agent's EMF listener; neuron-monitor-cloudwatch.py, whose metrics no document names, is gone.
    script = _neuron_script()
    assert (
        "/usr/bin/python3 /opt/efa-training/host_metrics.py neuron --environment prod --host ${INSTANCE_ID}"
        " --agent tcp://127.0.0.1:25888 --log-group /efa-training/prod/batch-host-metrics"
    ) in script
    assert "neuron-monitor-cloudwatch" not in script


def test_the_exporter_is_written_to_the_host_verbatim():
    # The quoted heredoc holds the image's module unchanged: bash ends it at the first line that is only HOSTMETRICS.
    lines = _neuron_script().splitlines()
    start = lines.index("cat > /opt/efa-training/host_metrics.py <<'HOSTMETRICS'") + 1
    body = lines[start : lines.index("HOSTMETRICS", start)]
    assert "\n".join(body) == HOST_METRICS_SOURCE.read_text().rstrip("\n")


def test_only_neuron_hosts_open_the_agents_emf_listener():
    # logs.metrics_collected.emf makes the agent listen on tcp:25888 (CloudWatch user guide, "Using the CloudWatch
    # agent to send embedded metric format logs"); GPU hosts have nothing to send there.
    neuron = cloudwatch_agent_config(CATALOGUE["trn1.32xlarge"], "dev")
    gpu = cloudwatch_agent_config(CATALOGUE["p5.48xlarge"], "dev")
    assert neuron["logs"] == {"metrics_collected": {"emf": {}}} and "logs" not in gpu


def test_the_host_user_data_fits_ec2s_limit():
    # "User data is limited to 16 KB, in raw form, before it is base64-encoded" (EC2 user guide, "Work with instance
    # user data"): the Neuron host's script, exporter included, with names as long as real ones, and 1 KB left for the
    # MIME wrapper and the part Batch adds.
    script = host_commands(
        instance=CATALOGUE["trn1n.32xlarge"],
        fsx_dns_name="fs-0123456789abcdef0.fsx.ap-southeast-2.amazonaws.com",
        fsx_mount_name="abcdefgh",
        fsx_revision="f" * 64,
        environment="production-environment",
        ecs_stop_timeout_seconds=120,
    )
    assert len("\n".join(script).encode()) + 1024 < 16 * 1024


def test_hosts_without_efa_reserve_no_huge_pages():
    # 5128 x 2 MiB pages are for libfabric's EFA provider (EC2 user guide, "Get started with EFA"); a validation host
    # without EFA (g5.xlarge: 16 GiB) would lose 10 GiB of the memory its container is promised.
    script = "\n".join(
        host_commands(
            instance=CATALOGUE["g5.xlarge"], fsx_dns_name="d", fsx_mount_name="m", environment="dev", check_efa=False
        )
    )
    assert "nr_hugepages" not in script and "uverbs" not in script


def test_a_failed_step_is_named_for_the_first_job_and_the_host_stays_up(tmp_path):
    # A host that powered itself off left its job RUNNABLE and Batch launched another, in a loop until the state's
    # timeout; now the step is written where the job's launcher reads it (runtime/bad_hosts.py setup_failure). Run in
    # bash: the script's lines up to the instance id, a failing mount after them, `shutdown` a recorder.
    lines = host_commands(instance=CATALOGUE["p5.48xlarge"], fsx_dns_name="d", fsx_mount_name="m", environment="dev")
    head = lines[1 : next(i for i, line in enumerate(lines) if "instance-id" in line and ">" in line)]
    identity = tmp_path / "identity"
    script = "\n".join(
        [
            f"shutdown() {{ touch {tmp_path}/shutdown; }}",
            "curl() { echo i-0123456789abcdef0; }",
            *(line.replace(HOST_IDENTITY_DIR, str(identity)).replace("/etc/ecs/", f"{tmp_path}/") for line in head),
            "mount -t lustre d@tcp:/m /fsx-missing-here",
            "echo 'not reached'",
        ]
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "not reached" not in done.stdout
    assert "mount -t lustre d@tcp:/m" in (identity / HOST_SETUP_FAILED).read_text()
    assert not (tmp_path / "shutdown").exists()


def test_the_ecs_agent_settings_come_before_any_step_that_may_fail():
    # A host that stops at a failed step still keeps awsvpc containers from the host role (ECS_AWSVPC_BLOCK_IMDS).
    lines = host_commands(
        instance=CATALOGUE["p5.48xlarge"], fsx_dns_name="d", fsx_mount_name="m", environment="dev",
        ecs_stop_timeout_seconds=300,
    )  # fmt: skip
    block = next(i for i, line in enumerate(lines) if "ECS_AWSVPC_BLOCK_IMDS=true" in line)
    assert block < next(i for i, line in enumerate(lines) if line.startswith("trap "))

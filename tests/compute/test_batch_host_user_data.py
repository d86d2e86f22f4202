"""The Batch hosts' preparation alone: the host script (FSx mount, huge pages, accelerator check) and the CloudWatch
agent's configuration (the metrics the dashboard and the idle alarm read)."""

from config import CATALOGUE
from constructs.compute.batch.host_user_data import cloudwatch_agent_config, host_commands


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


def test_neuron_host_checks_neuron_devices():
    # Trainium hosts count /dev/neuron* and run neuron-ls instead of nvidia-smi.
    script = "\n".join(
        host_commands(instance=CATALOGUE["trn1.32xlarge"], fsx_dns_name="d", fsx_mount_name="m", environment="dev")
    )
    assert "neuron-ls" in script and "nvidia-smi" not in script and "-ne 16" in script


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


def test_neuron_host_publishes_to_the_environments_namespace():
    # neuron-monitor's CloudWatch publisher takes no dimension, so the namespace names the environment.
    script = "\n".join(
        host_commands(instance=CATALOGUE["trn1.32xlarge"], fsx_dns_name="d", fsx_mount_name="m", environment="prod")
    )
    assert "--namespace EfaTraining/prod/Neuron" in script


def test_hosts_without_efa_reserve_no_huge_pages():
    # 5128 x 2 MiB pages are for libfabric's EFA provider (EC2 user guide, "Get started with EFA"); a validation host
    # without EFA (g5.xlarge: 16 GiB) would lose 10 GiB of the memory its container is promised.
    script = "\n".join(
        host_commands(
            instance=CATALOGUE["g5.xlarge"], fsx_dns_name="d", fsx_mount_name="m", environment="dev", check_efa=False
        )
    )
    assert "nr_hugepages" not in script and "uverbs" not in script

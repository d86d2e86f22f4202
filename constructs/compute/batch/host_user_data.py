"""Host preparation for Batch training hosts: one shell script, wrapped as MIME multipart for Batch/ECS.

EKS nodes are prepared by the EKS accelerated AMI and the cluster's add-ons instead (constructs/compute/eks/).

What it does, in order (every step logs to /var/log/efa-training-host.log and the console):
1. on EFA hosts only, huge pages for libfabric's EFA provider (EC2 user guide, "Get started with EFA":
   vm.nr_hugepages=5128, 10 GiB a validation host without EFA would lose to nothing);
2. the EFA kernel driver: AL2023 kernels ship `efa`; if the expected uverbs devices are still missing,
   the EFA installer's minimal host part (kernel module + rdma-core) is installed;
3. the Lustre client (`dnf install -y lustre-client`) and the FSx mount at /fsx (relatime,flock);
4. an accelerator check: nvidia-smi must list every GPU, or neuron-ls every Trainium device;
5. the CloudWatch agent: `nvidia_gpu` (nvidia_smi_* in CWAgent) and `efa` metrics; on Neuron hosts also the
   project's own per-host NeuronCore utilisation (training_image/efa_training/runtime/host_metrics.py reads neuron-monitor's JSON and sends
   EMF lines to the agent's EMF listener); constructs/observability/accelerator_metrics.py names what dashboards read.
A failed step writes what failed to HOST_IDENTITY_DIR/HOST_SETUP_FAILED and stops there. The host still joins its
compute environment, and the first job that lands on it refuses to run there: its launcher names the host bad
(runtime/bad_hosts.py setup_failure, exit 8) and the pipeline terminates it before the retry (quarantine.py), within
the stage's quarantine retries. A host that powered itself off instead left its job RUNNABLE, and Batch launched
another host for it, and another, until the state's timeout: hours of accelerator instances that never ran a job.
The ECS agent settings come first, so a host that stops early still keeps containers from the instance profile.
"""

import json
from pathlib import Path

import aws_cdk.aws_ec2 as ec2

from config import Accelerator, InstanceType
from config.layout import FSX_MOUNT_PATH, HOST_IDENTITY_DIR, HOST_SETUP_FAILED
from constructs.observability.accelerator_metrics import CWAGENT, ENVIRONMENT_DIMENSION, batch_host_metrics_log_group

# EC2 user guide, EFA: 5128 pages of 2 MiB for the libfabric EFA provider's registered buffers.
HUGE_PAGES = 5128
EFA_INSTALLER_URL = "https://efa-installer.amazonaws.com/aws-efa-installer-latest.tar.gz"
CWAGENT_CONFIG = "/opt/aws/amazon-cloudwatch-agent/etc/efa-training.json"
LOG = "/var/log/efa-training-host.log"
# The image's own exporter, copied onto Neuron hosts. Standard library only: it runs on the host's python3, which on
# AL2023 "will remain as Python 3.9" (Amazon Linux 2023 user guide, "Python in AL2023").
HOST_METRICS_SOURCE = Path(__file__).resolve().parents[3] / "training_image/efa_training/runtime/host_metrics.py"
HOST_METRICS_PATH = "/opt/efa-training/host_metrics.py"
# The agent's EMF listener: "listens on the default socket tcp:25888" (CloudWatch user guide, "Using the CloudWatch
# agent to send embedded metric format logs").
EMF_ENDPOINT = "tcp://127.0.0.1:25888"


def cloudwatch_agent_config(instance: InstanceType, environment: str) -> dict:
    """The agent's JSON: GPU and EFA counters in CWAgent (dimensions index/name/host and device/port/eniId).

    GPU, memory and disk metrics also carry Environment=<env> (a section's own `append_dimensions`, CloudWatch
    user guide, CloudWatch-Agent-Configuration-File-Details.html), so dashboards and the idle alarm read only
    this environment's hosts; the agent's `efa` section takes no such field (its JSON schema)."""
    scoped = {"append_dimensions": {ENVIRONMENT_DIMENSION: environment}, "metrics_collection_interval": 60}
    metrics: dict = {
        "efa": {
            "measurement": ["rx_bytes", "tx_bytes", "rx_dropped", "rdma_read_bytes", "rdma_write_bytes"],
            "metrics_collection_interval": 60,
        },
        "mem": {"measurement": ["mem_used_percent"], **scoped},
        "disk": {"measurement": ["used_percent"], "resources": ["/"], **scoped},
    }
    if instance.accelerator is Accelerator.NVIDIA:
        metrics["nvidia_gpu"] = {
            "measurement": [
                "utilization_gpu",
                "utilization_memory",
                "memory_used",
                "memory_total",
                "temperature_gpu",
                "power_draw",
            ],
            **scoped,
        }
    config: dict = {
        "agent": {"metrics_collection_interval": 60, "run_as_user": "root"},
        "metrics": {"namespace": CWAGENT, "metrics_collected": metrics},
    }
    if instance.accelerator is Accelerator.NEURON:
        # The EMF listener (same page as EMF_ENDPOINT) for host_metrics.py's NeuronCore utilisation.
        config["logs"] = {"metrics_collected": {"emf": {}}}
    return config


def host_commands(
    *,
    instance: InstanceType,
    fsx_dns_name: str,
    fsx_mount_name: str,
    environment: str,
    fsx_revision: str = "",
    check_efa: bool = True,
    ecs_stop_timeout_seconds: int | None = None,
) -> list[str]:
    """The shell lines (bash, set -euo pipefail) that prepare one host; tokens are allowed in the FSx names."""
    failed = f"{HOST_IDENTITY_DIR}/{HOST_SETUP_FAILED}"
    lines = [
        f"exec > >(tee -a {LOG} | logger -t efa-training-host -s 2>/dev/console) 2>&1",
        "set -euo pipefail",
        *_ecs_settings(ecs_stop_timeout_seconds),
        "# A host that fails a step says which, for the first job on it to refuse the host (config/layout.py).",
        f'trap \'echo "efa-training host preparation failed at line $LINENO: $BASH_COMMAND"; mkdir -p {HOST_IDENTITY_DIR}; '
        f'echo "line $LINENO: $BASH_COMMAND" > {failed}\' ERR',
        "TOKEN=$(curl -sS -X PUT http://169.254.169.254/latest/api/token -H 'X-aws-ec2-metadata-token-ttl-seconds: 300')",
        'AWS_REGION=$(curl -sS -H "X-aws-ec2-metadata-token: $TOKEN" http://169.254.169.254/latest/meta-data/placement/region)',
        "# 0. this host's instance id for its containers, which cannot reach the metadata service: a bad-host record",
        "#    names it, and the pipeline terminates it before the retry (constructs/pipeline/quarantine.py)",
        f"mkdir -p {HOST_IDENTITY_DIR}",
        'curl -sS -H "X-aws-ec2-metadata-token: $TOKEN" http://169.254.169.254/latest/meta-data/instance-id '
        f"> {HOST_IDENTITY_DIR}/instance-id",
    ]
    if check_efa:
        lines += [
            "# 1. huge pages for the libfabric EFA provider (none on hosts without EFA: they would only take memory)",
            f"echo 'vm.nr_hugepages = {HUGE_PAGES}' > /etc/sysctl.d/90-efa-hugepages.conf",
            "sysctl -p /etc/sysctl.d/90-efa-hugepages.conf",
            f"# 2. the EFA driver: {instance.efa_interfaces} uverbs device(s) expected on {instance.name}",
            "modprobe efa || true",
            "efa_devices() { ls /dev/infiniband/uverbs* 2>/dev/null | wc -l; }",
            f'if [ "$(efa_devices)" -lt {instance.efa_interfaces} ]; then',
            f"  curl -sSfL {EFA_INSTALLER_URL} -o /tmp/efa.tar.gz && tar -xzf /tmp/efa.tar.gz -C /tmp",
            "  (cd /tmp/aws-efa-installer && ./efa_installer.sh -y --minimal)",
            "  modprobe efa",
            "fi",
            f'if [ "$(efa_devices)" -lt {instance.efa_interfaces} ]; then '
            f'echo "EFA check failed: $(efa_devices) of {instance.efa_interfaces} uverbs devices"; false; fi',
        ]
    lines += [
        "# 3. FSx for Lustre at " + FSX_MOUNT_PATH,
        # The file system's revision (StorageStack.file_system_revision): a replaced file system changes this
        # line, so the launch template gets a new version with the new names in the same deploy.
        f"# file system revision {fsx_revision or 'unversioned'}",
        "dnf install -y lustre-client",
        f"mkdir -p {FSX_MOUNT_PATH}",
        f"echo '{fsx_dns_name}@tcp:/{fsx_mount_name} {FSX_MOUNT_PATH} lustre defaults,relatime,flock,_netdev 0 0' >> /etc/fstab",
        f"mountpoint -q {FSX_MOUNT_PATH} || mount -t lustre -o relatime,flock {fsx_dns_name}@tcp:/{fsx_mount_name} {FSX_MOUNT_PATH}",
    ]
    if instance.accelerator is Accelerator.NVIDIA:
        lines += [
            f"# 4. every GPU visible: {instance.accelerators} x {instance.accelerator_model}",
            "GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)",
            f'if [ "$GPUS" -ne {instance.accelerators} ]; then echo "GPU check failed: $GPUS of {instance.accelerators}"; false; fi',
        ]
    else:
        lines += [
            f"# 4. every Trainium device visible: {instance.accelerators} (/dev/neuron0..{instance.accelerators - 1})",
            "DEVICES=$(ls /dev/neuron* | wc -l)",
            f'if [ "$DEVICES" -ne {instance.accelerators} ]; then echo "Neuron check failed: $DEVICES of {instance.accelerators}"; false; fi',
            "/opt/aws/neuron/bin/neuron-ls",
        ]
    lines += metrics_agent_commands(instance, environment)
    lines.append("echo 'efa-training host ready'")
    return lines


def _ecs_settings(ecs_stop_timeout_seconds: int | None) -> list[str]:
    """The multi-node hosts' ECS agent settings, written before any step that may fail."""
    if not ecs_stop_timeout_seconds:
        return []
    return [
        # ECS waits this long between SIGTERM and SIGKILL (default 30 s): time for the final checkpoint.
        f"echo 'ECS_CONTAINER_STOP_TIMEOUT={ecs_stop_timeout_seconds}s' >> /etc/ecs/ecs.config",
        # Multi-node jobs run in awsvpc mode (Batch user guide, "Compute environments for multi-node parallel
        # jobs"): keep their containers from the instance profile; they use the job role (ECS developer guide,
        # "Amazon ECS container instance security considerations": ECS_AWSVPC_BLOCK_IMDS).
        "echo 'ECS_AWSVPC_BLOCK_IMDS=true' >> /etc/ecs/ecs.config",
    ]


def metrics_agent_commands(instance: InstanceType, environment: str) -> list[str]:
    """Step 5: the CloudWatch agent with cloudwatch_agent_config; on Neuron hosts the NeuronCore exporter as a service.

    neuron-monitor's own companion, neuron-monitor-cloudwatch.py, is documented by its command line only (Neuron docs,
    "Neuron Monitor User Guide", companion scripts): no document names the metrics it publishes, so no alarm could
    read them truthfully. host_metrics.py reads neuron-monitor's documented JSON instead."""
    agent_json = json.dumps(cloudwatch_agent_config(instance, environment), separators=(",", ":"))
    lines = [
        "# 5. CloudWatch agent: nvidia_smi_* and efa_* in CWAgent",
        "dnf install -y amazon-cloudwatch-agent",
        f"cat > {CWAGENT_CONFIG} <<'CWAGENT'",
        agent_json,
        "CWAGENT",
        f"/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl -a fetch-config -m ec2 -s -c file:{CWAGENT_CONFIG}",
    ]
    if instance.accelerator is not Accelerator.NEURON:
        return lines
    metadata = "http://169.254.169.254/latest"
    return lines + [
        "# NeuronCore utilisation per host: EfaTraining AcceleratorUtilization, dimensions Environment and Host",
        f"INSTANCE_ID=$(curl -sS -H \"X-aws-ec2-metadata-token: $(curl -sS -X PUT {metadata}/api/token -H 'X-aws-ec2-metadata-token-ttl-seconds: 60')\" {metadata}/meta-data/instance-id)",
        f"mkdir -p {HOST_METRICS_PATH.rsplit('/', 1)[0]}",
        # Verbatim, so the host runs (and an operator reads) exactly the image's module; ~9 KB of EC2's 16 KB.
        f"cat > {HOST_METRICS_PATH} <<'HOSTMETRICS'",
        HOST_METRICS_SOURCE.read_text().rstrip("\n"),
        "HOSTMETRICS",
        "cat > /etc/systemd/system/efa-training-host-metrics.service <<UNIT",
        "[Unit]",
        "Description=NeuronCore utilisation to the CloudWatch agent (EMF)",
        "After=network-online.target amazon-cloudwatch-agent.service",
        "[Service]",
        f"ExecStart=/usr/bin/python3 {HOST_METRICS_PATH} neuron --environment {environment} --host ${{INSTANCE_ID}}"
        f" --agent {EMF_ENDPOINT} --log-group {batch_host_metrics_log_group(environment)}",
        "Restart=always",
        "[Install]",
        "WantedBy=multi-user.target",
        "UNIT",
        "systemctl daemon-reload && systemctl enable --now efa-training-host-metrics.service",
    ]


def host_user_data(**kwargs) -> ec2.MultipartUserData:
    """MIME multipart user data: Batch and ECS accept only that in a launch template, and merge their own part."""
    script = ec2.UserData.for_linux()
    script.add_commands(*host_commands(**kwargs))
    multipart = ec2.MultipartUserData()
    multipart.add_user_data_part(script, ec2.MultipartBody.SHELL_SCRIPT, True)
    return multipart

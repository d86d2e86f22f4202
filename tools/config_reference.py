"""docs/configuration.md's field table, rendered from config/environment.py (a test holds the page to it).

.venv/bin/python -m tools.config_reference    # print the table to paste into docs/configuration.md

One row per field of EnvironmentConfig, in its order; the default is the dataclass's own, the limits are the module's
constants, and what each field takes, in words, is FIELDS below. A field added to the configuration without a row
here, or a row left for a field that is gone, is an error, so the page cannot drift from the code.
"""

from dataclasses import MISSING, Field, fields

from config import environment
from config.catalogue import efa_instance_types
from config.environment import EnvironmentConfig

HEADER = "| field | default | allowed values |\n|---|---|---|"

# Field -> (what follows its default, in words; what it takes). {name} is one of LIMITS, filled in from the code.
FIELDS: dict[str, tuple[str, str]] = {
    "region": (
        "",
        (
            "an AWS region of the list shipped in `config/regions.py` (checked 2026-11), e.g. `us-east-1`. Where "
            "CloudFormation has no `AWS::Budgets::Budget` (`NO_BUDGETS` there, e.g. `eu-north-1`) synth leaves "
            "the budget out with a warning, to be created in the Billing console or a region that has it; "
            "`ap-southeast-6`, without FSx, is refused"
        ),
    ),
    "compute": (
        "",
        "`batch`, `eks` or `sagemaker` ([when to choose which](sagemaker.md#choosing-a-backend))",
    ),
    "instance_type": (
        "",
        "a catalogue type with EFA: {efa_types} ([the catalogue](#instance-catalogue))",
    ),
    "nodes": (
        "",
        (
            "1 to {max_nodes} (a guard against expensive typos): the cluster's maximum nodes; a pipeline run uses "
            "up to this many on EKS and exactly this many on Batch"
        ),
    ),
    "account": (
        "(the CLI's credentials decide)",
        "12 digits",
    ),
    "availability_zone": (
        "(the region's first AZ)",
        "a zone of `region` from the same list, e.g. `us-east-1a`; the training subnet and FSx go there",
    ),
    "vpc_cidr": (
        "",
        "a /16 inside 10.0.0.0/8",
    ),
    "fsx_deployment_type": (
        "",
        "`PERSISTENT_2` or `SCRATCH_2`",
    ),
    "fsx_storage_gib": (
        "",
        "1200, 2400 or a multiple of 2400, at most {fsx_max_storage_gib} (FSx for Lustre's default quota)",
    ),
    "fsx_throughput_per_tib": (
        "",
        "125, 250, 500 or 1000 MB/s per TiB (used by `PERSISTENT_2`)",
    ),
    "budget_monthly_usd": (
        "",
        "a positive amount, at most 1,000,000,000",
    ),
    "alert_emails": (
        "",
        (
            "up to {max_alert_emails} distinct ASCII e-mail addresses subscribed to the alerts topic (budgets, "
            "alarms, pipeline)"
        ),
    ),
    "tags": (
        "",
        (
            "up to {max_tags} `Key=Value` cost-allocation tags of your own (ASCII letters, digits, spaces and `_ "
            ". : / + @ -`; keys not `Project`, `Environment` or `aws:…`), e.g. `-c "
            "tags=CostCenter=ml-42,Team=research`; on every resource except Batch compute environments, queues "
            "and the scheduling policy, whose tags CloudFormation can only set by replacing them ([Day "
            "two](operators-guide.md#day-two-what-a-redeploy-does))"
        ),
    ),
    "retain_data": (
        "",
        "`true`: `cdk destroy` keeps the bucket, FSx, images and logs; `false`: everything goes",
    ),
    "noncurrent_version_days": (
        "",
        (
            "1 to 3650: days S3 keeps a replaced or deleted version under `checkpoints/` and `runs/` (every "
            "checkpoint write and prune is one); `models/` and `datasets/` keep theirs"
        ),
    ),
    "log_retention_days": (
        "",
        "a CloudWatch Logs retention (1, 3, 5, 7, 14, 30, 60, 90, ... 3653)",
    ),
    "ecr_keep_images": (
        "",
        "1 to 1000 images kept per repository",
    ),
    "eks_capacity_type": (
        "",
        (
            "`on_demand` or `spot` (EKS accelerator node group); a Capacity Block is `capacity_reservation` "
            "(0.3.0's `capacity_block` and `eks_capacity_reservation_id` are refused with a line saying so)"
        ),
    ),
    "eks_admin_role_arns": (
        "",
        (
            "up to {max_admin_roles} distinct IAM role or user ARNs given cluster-admin access entries (empty: "
            "`make deploy` names the deploying principal)"
        ),
    ),
    "eks_public_access_cidrs": (
        "(any address; authentication still applies)",
        (
            "up to 40 IPv4 CIDR blocks allowed to reach the EKS API server's public endpoint. The pipeline's "
            "`eks:runJob` reaches it from AWS's own addresses (Step Functions supports only public endpoints): a "
            "list that leaves them out stops every run"
        ),
    ),
    "eks_kubeflow_trainer": (
        "",
        (
            "`true` installs Kubeflow Trainer's chart and a `ClusterTrainingRuntime` (the pipeline runs plain "
            "Indexed Jobs and needs neither; the chart is tested upstream on Kubernetes 1.31-1.34 only)"
        ),
    ),
    "image_tag": (
        "(build from `training_image/` at deploy)",
        ("a tag already pushed to the project's ECR repository (up to 128 ASCII letters, digits, `_`, `.`, `-`)"),
    ),
    "gpu_idle_threshold_percent": (
        "",
        (
            "0-100: alarm when one host's accelerators (of this environment's training hosts) average below this "
            "utilisation ..."
        ),
    ),
    "gpu_idle_minutes": (
        "",
        "... for this long (a multiple of 5, from 5 to 1440)",
    ),
    "fsx_free_capacity_alarm_percent": (
        "",
        "0-100: alarm when FSx free capacity falls below this share of `fsx_storage_gib`",
    ),
    "batch_research_weight": (
        "",
        "Batch fair-share weight factor of the `research` share (0.0001 to 999.9999; lower gets more)",
    ),
    "batch_production_weight": (
        "",
        "the same for the `production` share",
    ),
    "batch_train_timeout_hours": (
        "",
        (
            "1 to {max_train_timeout_hours}: one training attempt's timeout on every backend (Batch's job "
            "timeout; SageMaker's `MaxRuntimeInSeconds`, one attempt per job; on EKS the Job's "
            "`activeDeadlineSeconds`, plus 30 minutes for scale-up and image pull) (a deploy that replaces hosts "
            "waits at most {update_wait_minutes} minutes for a running attempt: Batch `UpdatePolicy`); the "
            "pipeline's Train state waits for every attempt a run allows"
        ),
    ),
    "batch_single_node_instance_type": (
        "(the catalogue's small type: g5.xlarge, p5.4xlarge or trn1.2xlarge)",
        (
            "a catalogue type with the same accelerator family, for validation and other one-node jobs (they use "
            "one accelerator); on SageMaker too (as `ml.<type>`)"
        ),
    ),
    "batch_single_node_spot": (
        "",
        "run single-node jobs on Spot (multi-node jobs never do: Batch does not allow it)",
    ),
    "capacity_wait_hours": (
        "",
        (
            "0 to {max_capacity_wait_hours}: how long a run waits for instances EC2 cannot supply, every backend; "
            "the sanity check, compile and training are asked again every 5 minutes without spending an attempt, "
            "then the run fails `CapacityUnavailable` (0: at the first shortage)"
        ),
    ),
    "batch_capacity_wait_minutes": (
        "",
        (
            "5 to 60: how long one Batch multi-node submission waits in `RUNNABLE` for capacity before its queue "
            "cancels it (the hosts that did launch idle meanwhile); single-node jobs wait 60 minutes (20 on Spot)"
        ),
    ),
    "eks_node_wait_minutes": (
        "",
        (
            "5 to 60: on EKS, how long a multi-node job waits for the run's training nodes to be in service "
            "(their Auto Scaling group, read once a minute) before the submission ends: as capacity unavailable "
            "(asked again, no attempt spent) where EC2 refused the launch for capacity, else as a failed attempt "
            "with EC2's message"
        ),
    ),
    "sagemaker_spot": (
        "",
        (
            "`true`: SageMaker training jobs use managed Spot (waiting for capacity up to `capacity_wait_hours` + "
            "30 minutes an attempt, interruptions included, resuming from the synced checkpoints); validation "
            "stays on demand"
        ),
    ),
    "sagemaker_data_source": (
        "",
        (
            "`fsx` (the file system as a read-only SageMaker data source in the training subnet) or `s3` (the "
            "bucket in fast file mode); Neuron types require `fsx`"
        ),
    ),
    "neuron_cc_flags": (
        "",
        (
            "Trainium only: the Neuron compiler's options (`NEURON_CC_FLAGS`) for the compile job and training "
            "alike, in neuronx-cc's syntax (ASCII letters, digits and `- _ . , = /`, single spaces, starting with "
            "`-`, at most 512 characters); no `--logical-nc-config`/`-lnc`: it must match the runtime's"
        ),
    ),
    "capacity_reservation": (
        "",
        (
            "reserved capacity for the training nodes (see [Reserved "
            'capacity](users-guide.md#reserved-capacity)): `{"kind": "capacity_block" or "on_demand", "id": '
            '"cr-..." (or, on demand, "resource_group": "<group ARN>"), "zone": "<its zone>", "instances": '
            '<count>}` on Batch and EKS, with `availability_zone` set to its zone; `{"kind": "training_plan", '
            '"training_plan": "<plan ARN>", "instances": <count>}` on SageMaker. `instances` at least `nodes`. '
            "Required, as a Capacity Block, for the types EC2 sells only that way (p5e.48xlarge, trn2.48xlarge) "
            "on Batch and EKS"
        ),
    ),
    "workloads": (
        "",
        (
            "declarations kept beside the code, by name (image folder or URI, launch, train and validate "
            "commands, validation metric and direction, log-line metrics, hyperparameter schema), checked when "
            "the app starts, each mistake one line; they change no template: a run reaches one once it is "
            "registered (`make push-workload ... REGISTER=...` or `pipeline_cli workload register`: "
            "[docs/workloads.md](workloads.md))"
        ),
    ),
    "tracking_uri": (
        "",
        (
            "an MLflow tracking server every run is tracked to ([Tracking runs with "
            "MLflow](users-guide.md#tracking-runs-with-mlflow)): its `http(s)://` URL, reachable from the "
            'training subnets, without a user or password in it (it would sit in every job definition); `""`: no '
            "tracking in AWS. Local runs always track to `local-run/mlflow.db`. Changing it updates the jobs' "
            "environment in place (a new Batch job definition revision, the EKS and SageMaker requests in the "
            "state machine): runs started after the deploy use it"
        ),
    ),
    "tracking_server": (
        "",
        (
            "`small`, `medium` or `large`: a SageMaker managed MLflow tracking server of that size (SageMaker "
            "recommends small for teams up to 25 users) that the storage stack creates, `efa-training-<env>`, "
            'which every job tracks to by its ARN with its own role (no `tracking_uri` then); `""`: none. It '
            "bills by the hour while it exists (see [Cost](operators-guide.md#cost)). Day two: its name is its "
            "one create-only property and is fixed by the environment, so a redeploy never replaces it and its "
            "runs; a size change applies in place; turning it off deletes the server and its run metadata "
            "(artifacts in `mlflow/` stay) unless `retain_data` keeps it; a kept server holds its name, so before "
            "turning it on again (or deploying the environment again after `cdk destroy`) delete it (`aws "
            "sagemaker delete-mlflow-tracking-server --tracking-server-name efa-training-<env>`), or the deploy "
            "fails on the name"
        ),
    ),
}


def _limits() -> dict[str, str]:
    """The figures the descriptions name, from the module that enforces them."""
    return {
        "efa_types": ", ".join(f"`{name}`" for name in efa_instance_types()),
        "max_nodes": str(environment.MAX_NODES),
        "fsx_max_storage_gib": f"{environment.FSX_MAX_STORAGE_GIB:,}",
        "max_alert_emails": str(environment.MAX_ALERT_EMAILS),
        "max_tags": str(environment.MAX_TAGS),
        "max_admin_roles": str(environment.MAX_ADMIN_ROLES),
        "max_train_timeout_hours": str(environment.MAX_BATCH_TRAIN_TIMEOUT_HOURS),
        "update_wait_minutes": str(environment.BATCH_UPDATE_WAIT_MAX_MINUTES),
        "max_capacity_wait_hours": str(environment.MAX_CAPACITY_WAIT_HOURS),
    }


def default(field: Field) -> str:
    """The dataclass default as the table shows it."""
    value = field.default
    if value is MISSING:
        return "(required)"
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple):
        return "none" if not value else f"`{','.join(value)}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return '`""`' if value == "" else f"`{value}`"


def _fill(text: str, limits: dict[str, str]) -> str:
    # str.replace, not str.format: the descriptions hold JSON braces of their own.
    for name, value in limits.items():
        text = text.replace("{" + name + "}", value)
    return text


def table() -> str:
    documented = [f for f in fields(EnvironmentConfig) if f.name != "name"]
    missing = [f.name for f in documented if f.name not in FIELDS]
    stale = sorted(set(FIELDS) - {f.name for f in documented})
    if missing or stale:
        raise ValueError(f"tools/config_reference.py FIELDS: no row for {missing}, rows for no field {stale}")
    limits, rows = _limits(), []
    for field in documented:
        note, allowed = FIELDS[field.name]
        cell = f"{default(field)} {note}" if note else default(field)
        rows.append(f"| `{field.name}` | {cell} | {_fill(allowed, limits)} |")
    return "\n".join([HEADER, *rows])


if __name__ == "__main__":
    print(table())

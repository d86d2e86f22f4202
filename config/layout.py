"""Where things live: the FSx mount on every node and the S3 prefixes the data repository links to.

The file system's root is linked to the bucket's root, so /fsx/<prefix> and s3://<bucket>/<prefix> hold the same files.
"""

FSX_MOUNT_PATH = "/fsx"
DATASETS_PREFIX = "datasets/"
# Written last by prepare_data.py beside a dataset's shards: its presence means a complete dataset.
DATASET_MANIFEST = "dataset.json"
CHECKPOINTS_PREFIX = "checkpoints/"
MODELS_PREFIX = "models/"
RUNS_PREFIX = "runs/"  # per-run reports: sanity check, verdicts, summaries
# Hosts the training named bad (a failed health check, the rank that hung first), one object per host named by its
# id (EC2 instance id, else Kubernetes node name, else host name), written by the container
# (training_image/efa_training/runtime/bad_hosts.py; tests hold the two equal): runs/<run_id>/bad-hosts/pending/<id>.
# The pipeline acts on each before its retry and moves it to runs/<run_id>/bad-hosts/<id> and the environment's list,
# bad-hosts/<id> (constructs/pipeline/quarantine.py).
BAD_HOSTS_PREFIX = "bad-hosts/"
BAD_HOSTS_PENDING = "bad-hosts/pending/"
# Where a Batch host writes its instance id (host_user_data.py) and where the job's container reads it: containers
# cannot reach the instance metadata service (hop limit 1, ECS_AWSVPC_BLOCK_IMDS), so the host hands it over.
HOST_IDENTITY_DIR = "/var/lib/efa-training"
HOST_IDENTITY_MOUNT = "/etc/efa-training/host"
INSTANCE_ID_FILE = f"{HOST_IDENTITY_MOUNT}/instance-id"
# Beside it, a host whose preparation failed names the failed step (host_user_data.py): every job's launcher refuses to
# run on such a host and names it bad (runtime/bad_hosts.py setup_failure), so the pipeline replaces it.
HOST_SETUP_FAILED = "setup-failed"
RUN_COST = "cost.json"  # runs/<run_id>/cost.json: the run's quote beside what its jobs cost, once validated
RUN_RECORD = "run.json"  # runs/<run_id>/run.json: a readable copy of a run's claim, written once the claim holds
# The runs table (constructs/storage/runs_table.py; the storage stack's output RUNS_TABLE_OUTPUT names it): the
# pipeline claims a run id with a conditional write of its item (constructs/pipeline/run_claim.py). The item holds the
# key, the execution holding the run, when it claimed it (ISO 8601) and the run's input as JSON text.
RUNS_TABLE_OUTPUT = "RunsTableName"
RUNS_TABLE_KEY = "run_id"
RUN_HOLDER = "execution"
RUN_SINCE = "since"
RUN_INPUT = "input"
# A run's approval, once validated and approved, as JSON text (constructs/pipeline/approval_record.py): the record the
# pipeline and a later run's init_from trust; models/<run_id>/approval.json is a copy for people.
RUN_APPROVAL = "approval"
# EKS's node-group lease, one item `lease#<environment>` in the same table (constructs/compute/eks/node_lease.py):
# no run id holds a '#' (contracts/run.py RUN_ID_CHARACTERS), so it is never a run's.
NODE_LEASE_PREFIX = "lease#"
# Trainium's persistent compile cache (training_image/efa_training/runtime/launch/neuron_compile.py), shared by every
# node and run.
NEURON_CACHE_PREFIX = "neuron-cache/"
# The file system's folders a Batch or EKS job writes (its checkpoints, its run folder, Trainium's compile cache): the
# only ones mounted read-write. The rest of /fsx (datasets/, models/, mlflow/) is mounted read-only, so no job writes
# what the data repository association would export over a dataset or an approved model. A per-run folder cannot be
# a mount of its own (a job definition's and a Job template's mounts are fixed): another run's folders stay writable.
FSX_WRITABLE = (CHECKPOINTS_PREFIX, RUNS_PREFIX, NEURON_CACHE_PREFIX)
# The cost-allocation tag `Project` on every resource (app.py) and every SageMaker training job (created at run time).
PROJECT = "efa-training"
# The training image's EMF namespace (training_image/efa_training/runtime/metrics.py NAMESPACE; tests hold the two
# equal).
TRAINING_METRICS_NAMESPACE = "EfaTraining"
# A validated run's quote and what its jobs cost at most, in USD (constructs/pipeline/run_cost.py; the dashboard)
RUN_QUOTED_METRIC, RUN_ACTUAL_METRIC = "RunQuotedUsd", "RunActualUsd"


def stack_prefix(environment: str) -> str:
    """Every stack of an environment is `EfaTraining-<env>-<Unit>` (Network, Storage, Batch, Pipeline, ...)."""
    return f"EfaTraining-{environment}"


def stack_name(environment: str, unit: str) -> str:
    return f"{stack_prefix(environment)}-{unit}"


def workload_repository_name(environment: str) -> str:
    """The environment's ECR repository of registered workloads' images (stacks/registry_stack.py; `make
    push-workload` pushes there): fixed, so the jobs' roles may pull from it by name, with no cross-stack value."""
    return f"{PROJECT}-{environment}-workloads"


def batch_name(environment: str, unit: str) -> str:
    """The fixed name of a Batch queue or job definition: `efa-training-<env>-<unit>` (train, multi-node, ...).

    Fixed so that the pipeline names what it submits to and no cross-stack value can go stale: a job definition's
    ARN carries a revision that every redeploy of a changed definition deregisters, while SubmitJob takes the
    name alone and uses "the latest active revision" (Batch API reference, SubmitJob `jobDefinition`).
    """
    return f"{PROJECT}-{environment}-{unit}"


def dashboard_name(environment: str) -> str:
    return f"{stack_prefix(environment)}-training"


def tracking_server_name(environment: str) -> str:
    """The environment's SageMaker managed MLflow tracking server (config tracking_server): `efa-training-<env>`, which
    TrackingServerName's pattern, [a-zA-Z0-9](-*[a-zA-Z0-9]){0,255} (CreateMlflowTrackingServer), takes."""
    return f"{PROJECT}-{environment}"

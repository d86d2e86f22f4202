"""One typed configuration per environment: parsed from cdk.json context, validated before any construct.

`cdk.json` holds named environments under `environments`; `-c env=NAME` picks one (default `dev`)
and `-c FIELD=VALUE` overrides any field, the string coerced to the field's type.
A bad value raises ConfigError with one line: the field, the value, what is allowed.
"""

import dataclasses
import json
import math
import re
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, NewType

from config.capacity import CapacityReservation, ReservationError, parse_reservation
from config.catalogue import CATALOGUE, Accelerator, InstanceType, efa_instance_types
from config.layout import stack_prefix
from config.regions import CHECKED as REGIONS_CHECKED
from config.regions import NO_FSX, REGION_ZONES, zones

if typing.TYPE_CHECKING:
    from contracts.workload import Workload

DEFAULT_ENVIRONMENT = "dev"
# A JSON object kept as its text, so the configuration stays a hashable value (workloads).
JsonObject = NewType("JsonObject", str)
PROJECT_ROOT = Path(__file__).resolve().parent.parent  # where workload image folders are found
# A run waiting for capacity holds its run id and, on Batch, may hold launched hosts: a week at most.
MAX_CAPACITY_WAIT_HOURS = 168
# A guard against expensive typos (160 for 16 p5 nodes is ~$15,000 an hour); raise it on purpose.
MAX_NODES = 64
# The compute backends app.py can build (its COMPUTE_STACKS has one line per name; a test keeps them equal).
COMPUTE_BACKENDS = ("batch", "eks", "sagemaker")
# A `cdk deploy` must never cut a training attempt short: the compute environment's update policy waits for
# running jobs at most 7200 minutes (Batch API reference, UpdatePolicy.jobExecutionTimeoutMinutes), so an
# attempt may not be allowed longer.
BATCH_UPDATE_WAIT_MAX_MINUTES = 7200
MAX_BATCH_TRAIN_TIMEOUT_HOURS = BATCH_UPDATE_WAIT_MAX_MINUTES // 60
FSX_DEPLOYMENT_TYPES = ("PERSISTENT_2", "SCRATCH_2")
FSX_THROUGHPUTS_PER_TIB = (125, 250, 500, 1000)
EKS_CAPACITY_TYPES = ("on_demand", "spot")  # a Capacity Block: capacity_reservation (config/capacity.py)
# Where a SageMaker training job reads the run's dataset: the FSx file system (a file-system data source in the
# training subnet) or the bucket (S3 fast file mode).
SAGEMAKER_DATA_SOURCES = ("fsx", "s3")
LOG_RETENTION_DAYS = (
    1,
    3,
    5,
    7,
    14,
    30,
    60,
    90,
    120,
    150,
    180,
    365,
    400,
    545,
    731,
    1096,
    1827,
    2192,
    2557,
    2922,
    3288,
    3653,
)

# Identifiers by the services' own patterns, ASCII only and matched whole (`fullmatch`: `$` would let a trailing
# newline through). E-mail: the SNS e-mail endpoint's local@domain form, at most 254 characters (RFC 5321).
_EMAIL = re.compile(r"[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(\.[A-Za-z0-9-]{1,63})*\.[A-Za-z]{2,63}", re.ASCII)
_ACCOUNT = re.compile(r"[0-9]{12}")
# IAM ARNs: path and name of [\w+=,.@-] (IAM API_Role: RoleName up to 64, Path up to 512 characters).
_ARN = re.compile(
    r"arn:aws(-cn|-us-gov)?:iam::[0-9]{12}:(role|user)(/[A-Za-z0-9_+=,.@-]+)*/[A-Za-z0-9_+=,.@-]{1,64}", re.ASCII
)
_CIDR16 = re.compile(r"10\.([0-9]{1,3})\.0\.0/16")
_IPV4_CIDR = re.compile(
    r"((25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])/([0-9]|[12][0-9]|3[0-2])"
)
# Docker image tags (and ECR's): [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}.
# AWS tags (Tagging AWS resources, "Tag naming limits and requirements"), ASCII: a key of 1-128, a value of 0-256.
_TAG = re.compile(r"(?![Aa][Ww][Ss]:)[A-Za-z0-9 _.:/+@-]{1,128}=[A-Za-z0-9 _.:/=+@-]{0,256}", re.ASCII)
# Tags the app sets itself (app.py): the cost-allocation tags the budgets filter on.
APP_TAG_KEYS = ("Project", "Environment")
MAX_TAGS = 40
_IMAGE_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# Numbers on the command line and in cdk.json: ASCII digits only (Python's int() and float() also take other
# scripts' digits, '_' separators, 'inf' and 'nan').
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
# neuronx-cc options (Neuron Compiler CLI reference): separated by single spaces, each option and value made of ASCII
# letters, digits and - _ . , = / (nothing a shell or the job's environment would read differently).
_NEURON_CC_FLAGS = re.compile(r"-[A-Za-z0-9_.,=/-]*( [A-Za-z0-9_.,=/-]+){0,63}", re.ASCII)
# An MLflow tracking server the jobs reach over HTTP(S), without credentials in the URL (they would sit in every
# job definition in plain text): scheme, host, optional port and path.
# CreateMlflowTrackingServer's TrackingServerSize (SageMaker API reference: Small, Medium, Large), "" for none.
TRACKING_SERVER_SIZES = {"": "", "small": "Small", "medium": "Medium", "large": "Large"}
_TRACKING_URI = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?", re.ASCII)
# The seeds' compiler flags: a transformer, optimisation level 1, matrix multiplications auto-cast to bf16 (Neuron
# Compiler CLI reference: --model-type, -O/--optlevel, --auto-cast, --auto-cast-type).
DEFAULT_NEURON_CC_FLAGS = "--model-type=transformer -O1 --auto-cast=matmult --auto-cast-type=bf16"
# FSx for Lustre: the default quota of Lustre storage per account is 100,800 GiB (FSx Lustre "Quotas").
FSX_MAX_STORAGE_GIB = 100_800
# AWS Budgets takes a limit with up to 2 decimals; a budget above a billion dollars a month is a typo.
BUDGET_MAX_USD = 1_000_000_000
# One SNS e-mail subscription per address: a handful of people, not a mailing list.
MAX_ALERT_EMAILS = 20
MAX_ADMIN_ROLES = 20


class ConfigError(ValueError):
    """A user's configuration mistake: printed as one line, never as a traceback."""


@dataclass(frozen=True)
class EnvironmentConfig:
    name: str
    region: str
    compute: str = "batch"
    instance_type: str = "g5.12xlarge"
    nodes: int = 2
    account: str | None = None
    availability_zone: str | None = None
    vpc_cidr: str = "10.0.0.0/16"
    fsx_deployment_type: str = "PERSISTENT_2"
    fsx_storage_gib: int = 1200
    fsx_throughput_per_tib: int = 125
    budget_monthly_usd: float = 1000.0
    alert_emails: tuple[str, ...] = ()
    # Cost-allocation tags of your own, "Key=Value", on every resource that takes a tag change in place (app.py).
    tags: tuple[str, ...] = ()
    retain_data: bool = False
    # Checkpoints and run reports: days a replaced or deleted object version is kept before S3 expires it.
    noncurrent_version_days: int = 7
    log_retention_days: int = 30
    ecr_keep_images: int = 10
    eks_capacity_type: str = "on_demand"
    eks_admin_role_arns: tuple[str, ...] = ()
    # Who may reach the EKS API server's public endpoint (CIDRs); none: anyone (authentication still applies).
    eks_public_access_cidrs: tuple[str, ...] = ()
    # Kubeflow Trainer's Helm chart (the pipeline runs plain Indexed Jobs and needs none of it).
    eks_kubeflow_trainer: bool = False
    image_tag: str | None = None
    # Observability: alarm when accelerators average below this utilisation for this long (idle GPUs cost money),
    # and when FSx free capacity falls below this share of fsx_storage_gib.
    gpu_idle_threshold_percent: float = 20.0
    gpu_idle_minutes: int = 30
    fsx_free_capacity_alarm_percent: float = 10.0
    # AWS Batch: fair-share weight factors (lower = larger share), the training jobs' attempt timeout,
    # the single-node (validation) instance type (unset: the training type) and whether it runs on Spot.
    batch_research_weight: float = 1.0
    batch_production_weight: float = 0.25
    batch_train_timeout_hours: int = 72
    batch_single_node_instance_type: str | None = None
    batch_single_node_spot: bool = True
    # Capacity: how long a run waits for instances EC2 cannot supply (every backend; 0: fail at once), and how long
    # one Batch multi-node submission waits before its queue cancels it (the hosts that did launch idle meanwhile).
    capacity_wait_hours: int = 2
    batch_capacity_wait_minutes: int = 20
    eks_node_wait_minutes: int = 20
    # SageMaker training jobs (compute=sagemaker): managed Spot for training (validation always runs on demand)
    # and where the jobs read the dataset.
    sagemaker_spot: bool = False
    sagemaker_data_source: str = "fsx"
    # Trainium: the Neuron compiler's flags (NEURON_CC_FLAGS) for the compile job and training alike.
    neuron_cc_flags: str = DEFAULT_NEURON_CC_FLAGS
    # Reserved capacity for the training nodes on any backend (config/capacity.py): {} for none.
    capacity_reservation: JsonObject = JsonObject("{}")
    # Your own training code (docs/workloads.md): workload name -> declaration, checked here (contracts/workload.py).
    workloads: JsonObject = JsonObject("{}")
    # MLflow tracking for every run (training_image/efa_training/runtime/tracking.py): a server's URL, "" for none;
    # or a SageMaker managed MLflow tracking server the storage stack creates, by size (constructs/storage/tracking.py).
    tracking_uri: str = ""
    tracking_server: str = ""

    def __post_init__(self) -> None:
        """Every field checked when the app starts, in this order: the first problem is the one reported."""
        self._check_placement()
        self._check_compute()
        self._check_capacity()
        self._check_storage()
        self._check_costs()
        self._check_eks()
        self._check_alarms_and_jobs()
        self._check_sagemaker()
        self._check_workloads()
        _check(
            self,
            "tracking_uri",
            not self.tracking_uri
            or (len(self.tracking_uri) <= 512 and bool(_TRACKING_URI.fullmatch(self.tracking_uri))),
            "empty (no tracking) or an MLflow tracking server's http(s) URL the training subnets reach, like "
            "https://mlflow.example.internal:5000 (no user or password in it; at most 512 characters)",
        )
        _check(
            self,
            "tracking_server",
            self.tracking_server in TRACKING_SERVER_SIZES and not (self.tracking_server and self.tracking_uri),
            "empty (no managed server) or small, medium or large: a SageMaker managed MLflow tracking server of that "
            "size (billed by the hour while it exists), and then no tracking_uri (the jobs track to one server)",
        )
        _check(
            self,
            "neuron_cc_flags",
            len(self.neuron_cc_flags) <= 512
            and bool(_NEURON_CC_FLAGS.fullmatch(self.neuron_cc_flags))
            and not any(f == "-lnc" or f.startswith("--logical-nc-config") for f in self.neuron_cc_flags.split()),
            "neuronx-cc options like the default, --model-type=transformer -O1 --auto-cast=matmult "
            "--auto-cast-type=bf16 (ASCII letters, digits and - _ . , = / only, starting with '-', at most 512 "
            "characters; no --logical-nc-config: it must match the runtime's NEURON_LOGICAL_NC_CONFIG)",
        )

    def _check_placement(self) -> None:
        """Where the environment lives: region, account and zone."""
        _check(
            self,
            "region",
            self.region in REGION_ZONES,
            f"an AWS region like us-east-1 (the project's list, checked {REGIONS_CHECKED}: config/regions.py)",
        )
        # The training storage is FSx for Lustre, whose CloudFormation type the Region's resource provider schemas
        # lack there (config/regions.py): refused here rather than failing synth on the type.
        _check(
            self,
            "region",
            self.region not in NO_FSX,
            f"a region with Amazon FSx (AWS::FSx::FileSystem), which the training storage needs: any region of "
            f"config/regions.py but {', '.join(sorted(NO_FSX))}",
        )
        _check(self, "account", self.account is None or bool(_ACCOUNT.fullmatch(self.account)), "12 digits, or unset")
        _check(
            self,
            "availability_zone",
            self.availability_zone is None or self.availability_zone in zones(self.region),
            f"a zone of region {self.region} ({', '.join(zones(self.region))}), or unset",
        )

    def _check_compute(self) -> None:
        """What trains: the backend, an EFA instance type, the node count, the VPC range."""
        _check(self, "compute", self.compute in COMPUTE_BACKENDS, " or ".join(COMPUTE_BACKENDS))
        _check(self, "instance_type", self.instance_type in CATALOGUE, f"one of {', '.join(CATALOGUE)}")
        _check(
            self,
            "instance_type",
            self.instance.has_efa,
            f"an instance type with EFA ({', '.join(efa_instance_types())}); "
            f"{self.instance_type} has no EFA, so collectives would crawl over TCP",
        )
        _check(self, "nodes", 1 <= self.nodes <= MAX_NODES, f"an integer from 1 to {MAX_NODES}")
        _check(
            self,
            "vpc_cidr",
            (match := _CIDR16.fullmatch(self.vpc_cidr)) is not None and int(match.group(1)) <= 255,
            "a /16 inside 10.0.0.0/8 like 10.0.0.0/16",
        )

    def _check_capacity(self) -> None:
        """The reservation (config/capacity.py), and what only a reservation can launch."""
        reservation = self.reservation
        # EC2 sells these through Capacity Blocks for ML only (catalogue, CAPACITY_BLOCKS_ONLY): on demand the jobs
        # would wait for capacity that is never sold that way.
        _check(
            self,
            "capacity_reservation",
            self.compute == "sagemaker" or not self.instance.capacity_blocks_only
            or (reservation is not None and reservation.capacity_block),
            f'a Capacity Block ({{"kind": "capacity_block", "id": "cr-...", ...}}) with {self.instance_type}: EC2 '
            "sells it through Capacity Blocks for ML only",
        )  # fmt: skip
        _check(
            self,
            "eks_capacity_type",
            reservation is None or self.compute != "eks" or self.eks_capacity_type == "on_demand",
            "on_demand with a capacity_reservation (reserved instances are not Spot)",
        )
        _check(
            self,
            "sagemaker_spot",
            reservation is None or not self.sagemaker_spot,
            "false with a training plan (its instances are reserved, not Spot)",
        )

    def _check_storage(self) -> None:
        """The FSx for Lustre file system."""
        _check(
            self,
            "fsx_deployment_type",
            self.fsx_deployment_type in FSX_DEPLOYMENT_TYPES,
            " or ".join(FSX_DEPLOYMENT_TYPES),
        )
        _check(
            self,
            "fsx_storage_gib",
            self.fsx_storage_gib in (1200, 2400)
            or (0 < self.fsx_storage_gib <= FSX_MAX_STORAGE_GIB and self.fsx_storage_gib % 2400 == 0),
            f"1200, 2400 or a multiple of 2400 GiB for {self.fsx_deployment_type}, at most "
            f"{FSX_MAX_STORAGE_GIB} (FSx for Lustre's default storage quota)",
        )
        _check(
            self,
            "fsx_throughput_per_tib",
            self.fsx_throughput_per_tib in FSX_THROUGHPUTS_PER_TIB,
            f"one of {', '.join(map(str, FSX_THROUGHPUTS_PER_TIB))} MB/s per TiB",
        )

    def _check_costs(self) -> None:
        """Budget, log retention and images kept."""
        _check(
            self,
            "budget_monthly_usd",
            0 < self.budget_monthly_usd <= BUDGET_MAX_USD,
            f"a positive amount in USD, at most {BUDGET_MAX_USD}",
        )
        _check_list(
            self, "alert_emails", _EMAIL, "e-mail addresses like ops@example.com", MAX_ALERT_EMAILS, max_length=254
        )
        _check(
            self,
            "log_retention_days",
            self.log_retention_days in LOG_RETENTION_DAYS,
            f"a CloudWatch Logs retention: {', '.join(map(str, LOG_RETENTION_DAYS))}",
        )
        _check(self, "ecr_keep_images", 1 <= self.ecr_keep_images <= 1000, "an integer from 1 to 1000")
        _check_list(
            self,
            "tags",
            _TAG,
            "Key=Value tags (ASCII letters, digits, spaces and _ . : / + @ -; a key of at most 128 characters not "
            "starting with aws:, a value of at most 256)",
            MAX_TAGS,
            max_length=385,
        )
        keys = [tag.split("=", 1)[0] for tag in self.tags]
        taken = next((key for key in keys if key in APP_TAG_KEYS or keys.count(key) > 1), None)
        _check(
            self,
            "tags",
            taken is None,
            f"each key once, and not {' or '.join(APP_TAG_KEYS)} (the app sets them)",
            taken,
        )
        _check(
            self,
            "noncurrent_version_days",
            1 <= self.noncurrent_version_days <= 3650,
            "an integer from 1 to 3650 (days S3 keeps a replaced checkpoint or report)",
        )

    def _check_eks(self) -> None:
        """EKS capacity and access, and the image tag."""
        _check(
            self,
            "eks_capacity_type",
            self.eks_capacity_type in EKS_CAPACITY_TYPES,
            " or ".join(EKS_CAPACITY_TYPES) + (
                ' (a Capacity Block is now capacity_reservation: {"kind": "capacity_block", "id": "cr-...", '
                '"zone": ..., "instances": ...})' if self.eks_capacity_type == "capacity_block" else ""
            ),
        )  # fmt: skip
        _check_list(
            self,
            "eks_public_access_cidrs",
            _IPV4_CIDR,
            "IPv4 CIDR blocks like 203.0.113.0/24",
            40,
            max_length=18,
        )
        _check_list(
            self,
            "eks_admin_role_arns",
            _ARN,
            "IAM role or user ARNs like arn:aws:iam::123456789012:role/Admin",
            MAX_ADMIN_ROLES,
            max_length=2048,
        )
        _check(
            self,
            "image_tag",
            self.image_tag is None or bool(_IMAGE_TAG.fullmatch(self.image_tag)),
            "a Docker tag: up to 128 ASCII letters, digits, '_', '.', '-', not starting with '.' or '-'; or unset",
        )

    def _check_alarms_and_jobs(self) -> None:
        """Alarm thresholds and the Batch jobs' own settings."""
        _check(
            self,
            "gpu_idle_threshold_percent",
            0 < self.gpu_idle_threshold_percent < 100,
            "a utilisation percentage between 0 and 100 (exclusive)",
        )
        _check(
            self,
            "gpu_idle_minutes",
            5 <= self.gpu_idle_minutes <= 1440 and self.gpu_idle_minutes % 5 == 0,
            "a multiple of 5 minutes from 5 to 1440 (the alarm evaluates 5-minute periods)",
        )
        _check(
            self,
            "fsx_free_capacity_alarm_percent",
            0 < self.fsx_free_capacity_alarm_percent < 100,
            "a percentage of fsx_storage_gib between 0 and 100 (exclusive)",
        )
        for weight in ("batch_research_weight", "batch_production_weight"):
            _check(
                self,
                weight,
                0.0001 <= getattr(self, weight) <= 999.9999,
                "a Batch fair-share weight factor from 0.0001 to 999.9999 (lower gets more compute)",
            )
        _check(
            self,
            "batch_train_timeout_hours",
            1 <= self.batch_train_timeout_hours <= MAX_BATCH_TRAIN_TIMEOUT_HOURS,
            f"an integer number of hours from 1 to {MAX_BATCH_TRAIN_TIMEOUT_HOURS} (Batch lets running jobs finish "
            f"for at most {BATCH_UPDATE_WAIT_MAX_MINUTES} minutes when a deploy updates their hosts)",
        )
        from contracts.run import QUEUE_WAIT_MINUTES  # here, not at the top: contracts.run imports config.layout

        _check(
            self,
            "capacity_wait_hours",
            0 <= self.capacity_wait_hours <= MAX_CAPACITY_WAIT_HOURS,
            f"an integer number of hours from 0 (fail at the first shortage) to {MAX_CAPACITY_WAIT_HOURS}",
        )
        _check(
            self,
            "batch_capacity_wait_minutes",
            5 <= self.batch_capacity_wait_minutes <= QUEUE_WAIT_MINUTES,
            f"an integer number of minutes from 5 to {QUEUE_WAIT_MINUTES} (the pipeline's stage timeouts allow each "
            "submission that wait)",
        )
        _check(
            self,
            "eks_node_wait_minutes",
            5 <= self.eks_node_wait_minutes <= QUEUE_WAIT_MINUTES,
            f"an integer number of minutes from 5 to {QUEUE_WAIT_MINUTES} (the pipeline's stage timeouts allow each "
            "submission that wait)",
        )
        single = self.batch_single_node_instance_type
        _check(
            self,
            "batch_single_node_instance_type",
            single is None or (single in CATALOGUE and CATALOGUE[single].accelerator is self.instance.accelerator),
            f"unset (then {self.instance.validation_instance_type}), or a catalogue instance type with "
            f"{self.instance.accelerator.value} accelerators (validation loads the training checkpoint on one)",
        )
        # EKS validates on a node group of its own, one node of one accelerator without EFA (accelerator_nodegroup.py).
        validation = self.single_node_instance
        _check(
            self,
            "batch_single_node_instance_type",
            self.compute != "eks" or (validation.accelerators == 1 and not validation.has_efa),
            "a single-accelerator catalogue type without EFA on EKS (the validation node group), or unset",
            value=validation.name,
        )

    def _check_sagemaker(self) -> None:
        """The SageMaker backend's settings, and that SageMaker trains (and validates) on the chosen types."""
        _check(
            self,
            "sagemaker_data_source",
            self.sagemaker_data_source in SAGEMAKER_DATA_SOURCES,
            " or ".join(SAGEMAKER_DATA_SOURCES),
        )
        if self.compute != "sagemaker":
            return
        offered = [name for name, it in CATALOGUE.items() if it.sagemaker_offered and it.has_efa]
        _check(
            self,
            "instance_type",
            self.instance.sagemaker_offered,
            f"a type SageMaker training offers as ml.<type> ({', '.join(offered)}) with compute=sagemaker",
        )
        _check(
            self,
            "sagemaker_data_source",
            self.sagemaker_data_source == "fsx" or self.instance.accelerator is not Accelerator.NEURON,
            f"fsx with {self.instance_type} on SageMaker: Neuron jobs keep their checkpoints in the shared file "
            "system (node-local checkpoint folders need object collectives, which the XLA backend lacks)",
        )
        single = self.single_node_instance
        _check(
            self,
            "batch_single_node_instance_type",
            single.sagemaker_offered,
            f"a type SageMaker training offers for validation; ml.{single.name} is not one",
            value=single.name,
        )

    def _check_workloads(self) -> None:
        """Each declaration (one line per mistake), then where declared workloads run today: on GPUs."""
        declared = self.declared_workloads
        _check(
            self,
            "workloads",
            not declared or self.instance.accelerator is Accelerator.NVIDIA,
            "no declared workload with a Trainium instance type: this release runs your own training code on GPU "
            "instances (docs/workloads.md, 'Where it runs')",
            value=", ".join(w.name for w in declared),
        )

    @property
    def declared_workloads(self) -> tuple["Workload", ...]:
        """The environment's own workloads, read from `workloads` (each mistake: ConfigError, one line)."""
        # Here, not at the top: contracts.run (which contracts.workload reads) imports config.layout.
        from contracts.workload import WorkloadError, parse_workloads

        try:
            return parse_workloads(self.workloads, PROJECT_ROOT)
        except WorkloadError as error:
            raise ConfigError(f"environment '{self.name}': {error}") from None

    @property
    def reservation(self) -> CapacityReservation | None:
        """The environment's reserved capacity, read from `capacity_reservation` (a mistake: ConfigError, one line)."""
        try:
            return parse_reservation(
                self.capacity_reservation,
                compute=self.compute,
                region=self.region,
                nodes=self.nodes,
                availability_zone=self.availability_zone,
            )
        except ReservationError as error:
            raise ConfigError(f"environment '{self.name}': {error}") from None

    @property
    def capacity_retries(self) -> int:
        """How often a pipeline stage asks again for capacity (contracts.run.capacity_retries): a Batch multi-node
        submission waits batch_capacity_wait_minutes before its queue cancels it, an EKS one eks_node_wait_minutes for
        the training nodes (constructs/compute/eks/node_wait.py); SageMaker answers at once."""
        from contracts.run import capacity_retries  # here, not at the top: contracts.run imports config.layout

        wait = {"batch": self.batch_capacity_wait_minutes, "eks": self.eks_node_wait_minutes}.get(self.compute, 0)
        return capacity_retries(self.capacity_wait_hours, wait)

    @property
    def instance(self) -> InstanceType:
        return CATALOGUE[self.instance_type]

    @property
    def min_nodes(self) -> int:
        """The fewest nodes a run may ask for: all of them on Batch, whose multi-node job definitions fix numNodes
        (Batch user guide, "Multi-node parallel jobs"); the backend runner's fixed_node_count says the same
        (tests/test_app_seam.py holds them equal), and the pipeline's MinNodes output is this."""
        return self.nodes if self.compute == "batch" else 1

    @property
    def single_node_instance(self) -> InstanceType:
        """Where single-node jobs (validation) run: the configured type, else the catalogue's small one."""
        return CATALOGUE[
            self.batch_single_node_instance_type or self.instance.validation_instance_type or self.instance_type
        ]

    @property
    def tag_map(self) -> dict[str, str]:
        """`tags` as a mapping, key to value."""
        return dict(tag.split("=", 1) for tag in self.tags)

    @property
    def budget_name(self) -> str:
        """The monthly budget's name. "-2": NotificationsWithSubscribers is create-only (AWS::Budgets::Budget resource
        schema), and a changed notification needs a new name (the 100 % actual one)."""
        return f"{self.stack_prefix}-monthly-2"

    @property
    def stack_prefix(self) -> str:
        """Stack names carry the environment so dev and prod can share an account."""
        return stack_prefix(self.name)


FIELD_NAMES = tuple(f.name for f in fields(EnvironmentConfig) if f.name != "name")
# Fields an earlier release had, and where what they said lives now.
MOVED_FIELDS = {
    "eks_capacity_reservation_id": 'is now capacity_reservation: {"kind": "capacity_block", "id": "cr-...", '
    '"zone": "<its zone>", "instances": <count>} (with availability_zone set to its zone), on any EC2 backend',
}
_TYPES = typing.get_type_hints(EnvironmentConfig)


def _check_list(
    config: EnvironmentConfig, name: str, pattern: re.Pattern, allowed: str, max_items: int, max_length: int
) -> None:
    """Every item matches `pattern` whole, no item twice, at most `max_items` items."""
    items = getattr(config, name)
    for item in items:
        _check(config, name, len(item) <= max_length and bool(pattern.fullmatch(item)), allowed, value=item)
    duplicates = sorted({item for item in items if items.count(item) > 1})
    _check(config, name, not duplicates, f"{allowed}, each once", value=duplicates[0] if duplicates else None)
    _check(config, name, len(items) <= max_items, f"at most {max_items} of them")


def _check(config: EnvironmentConfig, name: str, ok: bool, allowed: str, value: object = dataclasses.MISSING) -> None:
    if not ok:
        shown = getattr(config, name) if value is dataclasses.MISSING else value
        raise ConfigError(f"environment '{config.name}': {name}={shown!r} is not valid; expected {allowed}")


def _coerce(env: str, name: str, raw: object) -> Any:
    """Turn a context value (JSON from cdk.json, or a string from -c) into the field's type."""
    kind = _TYPES[name]
    optional = type(None) in typing.get_args(kind)
    base = next((t for t in typing.get_args(kind) if t is not type(None)), kind) if optional else kind

    def bad(expected: str) -> ConfigError:
        return ConfigError(f"environment '{env}': {name}={raw!r} is not valid; expected {expected}")

    if optional and (raw is None or (isinstance(raw, str) and raw.strip().lower() in ("", "none", "null"))):
        return None
    if base is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
            return raw.strip().lower() in ("true", "yes", "1")
        raise bad("true or false")
    if base is int:
        if isinstance(raw, bool):
            raise bad("an integer")
        if isinstance(raw, int) and abs(raw) < 10**15:
            return raw
        if isinstance(raw, str) and _INTEGER.fullmatch(raw.strip()) and len(raw.strip()) <= 16:
            return int(raw.strip())
        raise bad("an integer")
    if base is float:
        value = None
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            value = float(raw) if abs(raw) < 1e300 else None
        elif isinstance(raw, str) and _DECIMAL.fullmatch(raw.strip()):
            value = float(raw.strip())
        if value is None or not math.isfinite(value):
            raise bad("a number")
        return value
    if base is JsonObject:
        try:
            parsed: object = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise bad("a JSON object")
        return json.dumps(parsed, sort_keys=True)
    if typing.get_origin(base) is tuple:
        if isinstance(raw, str):
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        if isinstance(raw, list) and all(isinstance(item, str) for item in raw):
            return tuple(item.strip() for item in raw)
        raise bad("a list of strings (comma-separated on the command line)")
    if isinstance(raw, str):
        return raw.strip()
    raise bad("a string")


# CDK's own context keys: feature flags ("@aws-cdk/..."), "aws:cdk:..." and CLI bookkeeping.
_CDK_KEYS = re.compile(r"^(@|aws:|aws-cdk:|cdk[-:])|:")
_CDK_PLAIN_KEYS = frozenset({"acknowledged-issue-numbers", "cli-telemetry", "assetsBucketName"})


def load_config(context: dict) -> EnvironmentConfig:
    """Build the selected environment's config from the whole CDK context (cdk.json plus -c overrides)."""
    environments = context.get("environments")
    if not isinstance(environments, dict) or not environments:
        raise ConfigError("cdk.json: context.environments is missing; expected named environments like dev and prod")
    env = context.get("env", DEFAULT_ENVIRONMENT)
    if not isinstance(env, str) or env not in environments:
        raise ConfigError(f"env={env!r} is not valid; expected one of {', '.join(environments)} (from cdk.json)")

    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9-]{0,19}", env):
        raise ConfigError(
            f"env={env!r} is not valid; expected a name of letters, digits and '-' (it goes into stack names)"
        )
    if not isinstance(environments[env], dict):
        raise ConfigError(f"cdk.json environment '{env}': expected an object of fields, not {environments[env]!r}")
    values = dict(environments[env])
    unknown = [key for key in values if key not in FIELD_NAMES]
    if unknown and unknown[0] in MOVED_FIELDS:
        raise ConfigError(f"cdk.json environment '{env}': {unknown[0]} {MOVED_FIELDS[unknown[0]]}")
    if unknown:
        raise ConfigError(
            f"cdk.json environment '{env}': unknown field {unknown[0]!r}; expected fields: {', '.join(FIELD_NAMES)}"
        )
    for key, raw in context.items():
        if key in ("environments", "env") or _CDK_KEYS.search(key) or key in _CDK_PLAIN_KEYS:
            continue
        if key in MOVED_FIELDS:
            raise ConfigError(f"-c {key}={raw}: {key} {MOVED_FIELDS[key]}")
        if key not in FIELD_NAMES:
            raise ConfigError(
                f"-c {key}={raw}: unknown field {key!r}; expected env or one of: {', '.join(FIELD_NAMES)}"
            )
        values[key] = raw
    if "region" not in values:
        raise ConfigError(f"environment '{env}': region is missing; expected an AWS region like us-east-1")
    return EnvironmentConfig(name=env, **{key: _coerce(env, key, raw) for key, raw in values.items()})

"""The pipeline's jobs as SageMaker training jobs: one `sagemaker:createTrainingJob.sync` Task state per job.

A CustomState rather than tasks.SageMakerCreateTrainingJob: that task renders no CheckpointConfig, managed Spot,
RetryStrategy, FileSystemDataSource, ContainerEntrypoint/ContainerArguments or InfraCheckConfig, and takes no
JSONPath for the instance count.

Each job runs the training image with the image's own entry point and the mode as its first argument (the same
`launch.py MODE` contract as Batch and EKS); the run's job parameters travel as HyperParameters (strings, written to
/opt/ml/input/config/hyperparameters.json), which launch.py turns into flags. There is no separate sanity job: the
training job runs the sanity check on its own instances before it trains (`sanity_in_training`), because every
attempt and every Spot restart of a SageMaker job gets fresh instances, which only a check inside the job proves.
"""

from collections.abc import Mapping

import aws_cdk as cdk
import aws_cdk.aws_iam as iam
import aws_cdk.aws_stepfunctions as sfn

from config import Accelerator, InstanceType
from config.layout import CHECKPOINTS_PREFIX, MODELS_PREFIX, NEURON_CACHE_PREFIX, PROJECT, RUNS_PREFIX
from constructs import Construct
from constructs.compute.backend import MULTI_NODE_JOBS, JobKind, task_timeout
from constructs.compute.sagemaker.validation import retried_for_capacity
from constructs.nag import acknowledge, shown_arn
from constructs.pipeline.train_attempt import CAPACITY_REASON, FailureEnds
from contracts.job_environment import job_environment
from contracts.run import (
    FAILURE_REASON_MARKER,
    JOB_END_MARGIN_SECONDS,
    MAX_ATTEMPTS,
    QUEUE_WAIT_MINUTES,
    REFUSED_EXIT_CODES,
    WINDOW_ENDED_EXIT_CODE,
    Stage,
    stages,
)

# The image's ENTRYPOINT (training_image/Dockerfile.*): SageMaker would otherwise run it with the argument `train`
# (SageMaker developer guide, "How Amazon SageMaker AI Runs Your Training Image"); ContainerEntrypoint and
# ContainerArguments replace both (API_AlgorithmSpecification).
ENTRYPOINT = ("python", "/opt/training/launch.py")
# SageMaker's container paths (API_CheckpointConfig LocalPath default; /opt/ml/input/data/<channel>).
CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"
DATA_CHANNEL, CHECKPOINTS_CHANNEL, FSX_CHANNEL, MODEL_CHANNEL = "training", "checkpoints", "fsx", "model"
DATA_PATH = f"/opt/ml/input/data/{DATA_CHANNEL}"
CHECKPOINTS_INPUT_PATH = f"/opt/ml/input/data/{CHECKPOINTS_CHANNEL}"
FSX_PATH = f"/opt/ml/input/data/{FSX_CHANNEL}"
# A declared workload's validation: the training job's model artifact, a model.tar.gz that SageMaker copies here and
# does not unpack (API_Channel CompressionType "is used only in Pipe input mode"): the launcher unpacks it into
# MODEL_DIR before the validate command runs (runtime/launch/sagemaker.py unpack_model_archive).
MODEL_INPUT_PATH = f"/opt/ml/input/data/{MODEL_CHANNEL}"
# Where the validation finds that artifact: the training job's DescribeTrainingJob ModelArtifacts.S3ModelArtifacts
# ("The path of the S3 object that contains the model artifacts", API_ModelArtifacts), kept by the Train state.
TRAINED_MODEL = "$.jobs.train.ModelArtifact"
# SageMaker uploads /opt/ml/model as the job's model artifact and /opt/ml/output/data as its output (SageMaker
# developer guide, "How Amazon SageMaker AI Processes Training Output").
MODEL_PATH = "/opt/ml/model"
WORKLOAD_RUN_DIR = "/opt/ml/output/data/run"
NEURON_CACHE_ROOT = f"{FSX_PATH}/{NEURON_CACHE_PREFIX.rstrip('/')}"
# Every catalogue type has NVMe instance storage: SageMaker mounts it instead of an EBS volume, its size is fixed to the
# instance's, and VolumeSizeInGB may not exceed it (API_ResourceConfig VolumeSizeInGB). So the smallest store of the
# catalogue's types bounds the request (g5.xlarge: 250 GB); what the jobs get is the instance's own.
VOLUME_GIB = 100
# What the integration raises when CreateTrainingJob itself fails (Step Functions developer guide, "Create and
# manage Amazon SageMaker AI jobs with Step Functions": its training job example retries both): SageMaker's generic
# error (throttling, internal errors) and the account's instance quota for the type, which other jobs may free.
API_ERROR = "SageMaker.AmazonSageMakerException"
QUOTA_ERROR = "SageMaker.ResourceLimitExceededException"
API_RETRY: dict = {
    "errors": [API_ERROR],
    "interval": cdk.Duration.seconds(5),
    "max_attempts": 6,
    "backoff_rate": 2,
    "max_delay": cdk.Duration.minutes(2),
}
# A quota that other jobs hold is waited for as long as any backend's job waits for capacity (QUEUE_WAIT_MINUTES).
QUOTA_RETRY: dict = {
    "errors": [QUOTA_ERROR],
    "interval": cdk.Duration.minutes(5),
    "max_attempts": QUEUE_WAIT_MINUTES // 5,
    "backoff_rate": 1,
}
# The longest a training job may run (API_StoppingCondition MaxRuntimeInSeconds: 28 days), taken as the bound of
# MaxWaitTimeInSeconds too.
MAX_JOB_SECONDS = 28 * 24 * 3600
# Training job names: 1-63 letters, digits and '-' (API_CreateTrainingJob), unique in the account and region
# forever, so each submission appends 8 hex digits of a fresh UUID: `<run_id>-validate-1a2b3c4d` <= 58.
_UNIQUE_SUFFIX = "States.ArrayGetItem(States.StringSplit(States.UUID(), '-'), 0)"


class SageMakerJobRunner:
    """Runs the pipeline's train and validate jobs as SageMaker training jobs in the training subnet."""

    # A run may use fewer instances than the environment's maximum: ResourceConfig.InstanceCount follows `nodes`.
    fixed_node_count = False
    # The account's instance quota for the type is used up (or 0, as it starts for ml.p5): after the submission's own
    # waits for it (QUOTA_RETRY) a new training attempt cannot help, so the run fails naming it.
    rejected_errors = (QUOTA_ERROR,)
    # No RetryStrategy: with one, MaxRuntimeInSeconds "specifies the maximum time for all of the attempts in total"
    # (API_StoppingCondition), so a hung attempt could run max_attempts x the attempt timeout, and it retries only
    # SageMaker's InternalServerError (API_RetryStrategy). Each submission is one attempt with its own limit; the
    # pipeline's Retry makes the next (a fresh job that resumes from the run's checkpoints).
    restarts_lost_hosts = False
    sanity_in_training = True
    # Each job brings up its own hosts: SageMaker starts and stops the instances of every training job.
    node_scaling = None
    # What the Train state keeps of the training job (constructs/pipeline/train_attempt.py): its model artifact too,
    # which a declared workload's validation reads (TRAINED_MODEL).
    train_result = ("JobId", "JobName", "Status", "ModelArtifact")

    def __init__(
        self,
        *,
        image: str,
        role: iam.IRole,
        bucket_name: str,
        subnet_id: str,
        security_group_id: str,
        instance: InstanceType,
        validation_instance: InstanceType,
        environment: str,
        train_attempt_hours: int,
        spot: bool,
        file_system: tuple[str, str, str] | None = None,
        neuron_cc_flags: str = "",
        tracking_uri: str = "",
        training_plan: str | None = None,
        capacity_wait_hours: int = 0,
        subnet_zone: str | None = None,
    ) -> None:
        """`training_plan`: the ARN of the SageMaker training plan the jobs on the run's nodes run in (training,
        and Trainium's compile job; validation, on its own small type, does not). `file_system`: (FSx file system id,
        mount name, revision) to read datasets from; None reads them from S3.
        The revision (StorageStack.file_system_revision) is written into the jobs' environment.
        `capacity_wait_hours`: the environment's wait for capacity, which a managed Spot attempt may spend waiting for
        Spot capacity (interruptions included) without ending (`_spot_wait_seconds`). `subnet_zone`: the training
        subnet's Availability Zone, which a training plan's capacity must be in (the pipeline checks it as a run starts:
        constructs/pipeline/reservation_end.py)."""
        self.image, self.role, self.bucket_name = image, role, bucket_name
        self.subnet_id, self.security_group_id, self.subnet_zone = subnet_id, security_group_id, subnet_zone
        self.instance, self.validation_instance = instance, validation_instance
        self.environment, self.spot, self.file_system = environment, spot, file_system
        self.neuron_cc_flags, self.training_plan = neuron_cc_flags, training_plan
        self.tracking_uri, self.capacity_wait_hours = tracking_uri, capacity_wait_hours
        self._stages = stages(train_attempt_hours)

    def workload_jobs(
        self, scope: Construct
    ) -> tuple[sfn.Chain, list[sfn.TaskStateBase | sfn.CustomState | sfn.Parallel]] | None:
        """Nothing: CreateTrainingJob's AlgorithmSpecification carries the workload's image (its declaration in the
        job's Environment)."""
        return None

    def submit(
        self,
        scope: Construct,
        id_: str,
        *,
        job: JobKind,
        parameters: Mapping[str, str],
        job_name: str,
        nodes: str | None = None,
        attempts: str | None = None,
        result_path: str = sfn.JsonPath.DISCARD,
        timeout: cdk.Duration | str | None = None,
        declared: bool = False,
    ) -> sfn.CustomState | sfn.Parallel:
        if job == "sanity":
            raise ValueError("SageMakerJobRunner runs the sanity check inside the training job (sanity_in_training)")
        if attempts is not None:
            raise ValueError(
                "SageMakerJobRunner runs each job once (one attempt's runtime); the pipeline's Retry restarts it"
            )
        request = self.training_job(job=job, parameters=parameters, job_name=job_name, nodes=nodes, declared=declared)
        # The .sync result is the whole DescribeTrainingJob response; keep what operators look for, and training's
        # model artifact, which SageMaker uploaded from /opt/ml/model (API_ModelArtifacts S3ModelArtifacts).
        selector = {"JobId.$": "$.TrainingJobArn", "JobName.$": "$.TrainingJobName", "Status.$": "$.TrainingJobStatus"}
        if job == "train":
            selector["ModelArtifact.$"] = "$.ModelArtifacts.S3ModelArtifacts"
        validate = job == "validate"
        if job == "train" and self.spot:
            # A managed Spot job ends itself at MaxWaitTimeInSeconds, which holds its Spot allowance: its state waits
            # that long and the margin, not the pipeline's figure for the Train state (Batch's attempts, each with
            # one queue wait); within what the execution's timeout counts for one submission (_spot_wait_seconds).
            stopping = request["StoppingCondition"]
            timeout = cdk.Duration.seconds(stopping["MaxWaitTimeInSeconds"] + JOB_END_MARGIN_SECONDS)
        state: dict = {
            "Type": "Task",
            "Resource": f"arn:{cdk.Stack.of(scope).partition}:states:::sagemaker:createTrainingJob.sync",
            "Parameters": request,
            "ResultSelector": selector,
            "ResultPath": "$" if validate else result_path,
        }
        submission = sfn.CustomState(
            scope, f"{id_}Job" if validate else id_, state_json={**state, **task_timeout(timeout)}
        )
        submission.add_retry(**API_RETRY)
        submission.add_retry(**QUOTA_RETRY)
        if validate:
            # A trained model is never left unvalidated for want of one small instance or a lost one: tried again on
            # fresh instances when SageMaker failed the job, never when the validation itself did (validation.py).
            return retried_for_capacity(scope, id_, submission, result_path)
        return submission

    def training_job(
        self,
        *,
        job: JobKind,
        parameters: Mapping[str, str],
        job_name: str,
        nodes: str | None,
        declared: bool = False,
    ) -> dict:
        """The CreateTrainingJob request as an ASL payload template (API_CreateTrainingJob); a declared workload's
        job runs its image with its declaration in WORKLOAD and the contract's folders (docs/workloads.md)."""
        run_id = parameters["run_id"]
        training = job == "train"
        multi_node = job in MULTI_NODE_JOBS  # train, and compile on Trainium
        instance = self.instance if multi_node else self.validation_instance
        hyperparameters = {f"{name}.$": value for name, value in parameters.items()}
        if multi_node:
            hyperparameters["expected_nodes.$"] = f"States.Format('{{}}', {nodes or 1})"
        request: dict = {
            "TrainingJobName.$": f"States.Format('{{}}-{{}}', {job_name}, {_UNIQUE_SUFFIX})",
            "RoleArn": self.role.role_arn,
            "AlgorithmSpecification": {
                # the run's registered workload: its image, its declaration in WORKLOAD (workload_record.py)
                **({"TrainingImage.$": "$.run.registered.image"} if declared else {"TrainingImage": self.image}),
                "TrainingInputMode": "File",
                "ContainerEntrypoint": list(ENTRYPOINT),
                "ContainerArguments": [
                    job,
                    "--data",
                    DATA_PATH,
                    *(self._workload_flags(job) if declared else self._checkpoint_flags(job)),
                ],
            },
            "HyperParameters": hyperparameters,
            "Environment": {
                **self._environment(job, instance, run_id),
                **({"WORKLOAD.$": "$.run.registered.workload"} if declared else {}),
            },
            "ResourceConfig": {
                "InstanceType": instance.sagemaker_instance_type,
                **({"InstanceCount.$": nodes} if multi_node and nodes else {"InstanceCount": 1}),
                "VolumeSizeInGB": VOLUME_GIB,
                # A training job runs in a training plan's reserved instances when its ResourceConfig names the plan
                # (SageMaker API reference: CreateTrainingPlan, "Queue training jobs"; ResourceConfig.TrainingPlanArn).
                # Every job on the run's nodes does: Trainium's compile job is a training job on the plan's type too
                # (a plan's target is "training-job", any of them: SageMaker developer guide, "Training plans
                # utilization for SageMaker training jobs"), so it uses the capacity paid for, not on-demand hours.
                **({"TrainingPlanArn": self.training_plan} if multi_node and self.training_plan else {}),
            },
            # The training subnet and the EFA group (all traffic to and from itself, Lustre to FSx).
            "VpcConfig": {"Subnets": [self.subnet_id], "SecurityGroupIds": [self.security_group_id]},
            "InputDataConfig": [*self._channels(job, parameters), *self._model_channel(job, declared)],
            "OutputDataConfig": {"S3OutputPath.$": f"States.Format('{self._runs_uri}{{}}/sagemaker/', {run_id})"},
            "StoppingCondition": self._stopping_condition(self._stages[job], spot=training and self.spot),
            # Budgets and cost allocation filter on the same tags as the deployed resources (app.py).
            "Tags": [
                {"Key": "Project", "Value": PROJECT},
                {"Key": "Environment", "Value": self.environment},
                {"Key": "RunId", "Value.$": run_id},
            ],
        }
        if training and not self.checkpoints_on_fsx:
            # SageMaker uploads LocalPath to S3Uri while the job runs and restores it to every instance when a job
            # (re)starts (API_CheckpointConfig; "Checkpoints in Amazon SageMaker AI"): the run's checkpoint prefix,
            # the one a retried submission and the validation job read.
            request["CheckpointConfig"] = {"S3Uri.$": self._checkpoints_uri(run_id), "LocalPath": CHECKPOINT_LOCAL_PATH}
        if training and self.spot:
            request["EnableManagedSpotTraining"] = True
        return request

    def _stopping_condition(self, stage: Stage, *, spot: bool) -> dict:
        """How long one attempt may run and, on managed Spot, wait for capacity, at most 28 days
        (API_StoppingCondition): the attempt's time, and its deadline (contracts.run Stage.deadline_seconds, the one
        EKS Jobs get too) or on Spot its allowance (`_spot_wait_seconds`), which ends the job before the state that
        waits for it gives up: SageMaker's own end is an attempt failure, retried on fresh instances; the state's
        timeout is not."""
        queue = stage.deadline_seconds - stage.attempt_seconds
        if not spot:
            return {"MaxRuntimeInSeconds": min(stage.attempt_seconds, MAX_JOB_SECONDS - queue)}
        wait = self._spot_wait_seconds(stage)
        runtime = min(stage.attempt_seconds, MAX_JOB_SECONDS - wait)
        # MaxWait "must be larger than" MaxRuntime (SageMaker developer guide, "Managed Spot Training"); it "is the
        # amount of time spent waiting for Spot capacity plus the amount of time the job can run. ... If the job does
        # not complete during this time, SageMaker ends the job" (API_StoppingCondition MaxWaitTimeInSeconds).
        return {"MaxRuntimeInSeconds": runtime, "MaxWaitTimeInSeconds": runtime + wait}

    def _spot_wait_seconds(self, stage: Stage) -> int:
        """What a managed Spot attempt may spend beyond its runtime waiting for Spot capacity, at its start and after
        each interruption: the attempt's queue wait and the environment's capacity_wait_hours, so that waits within
        the capacity wait never end the attempt. At most what keeps the state that waits for the job (MaxWait and the
        margin) within the execution's count of one training submission (Stage.state_seconds(MAX_ATTEMPTS), what
        contracts.run.execution_seconds counts), so the execution's timeout still bounds the run."""
        queue = stage.deadline_seconds - stage.attempt_seconds
        counted = stage.state_seconds(MAX_ATTEMPTS) - JOB_END_MARGIN_SECONDS - stage.attempt_seconds
        return min(queue + self.capacity_wait_hours * 3600, counted)

    @property
    def checkpoints_on_fsx(self) -> bool:
        """Neuron jobs keep checkpoints in the shared FSx folder /fsx/checkpoints/<run_id>, as on Batch and EKS:
        node-local folders need an object collective for their manifest
        (training_image/efa_training/checkpointing/store.py), which the
        XLA backend lacks; the configuration requires sagemaker_data_source=fsx for Neuron types."""
        return self.instance.accelerator is Accelerator.NEURON

    @property
    def _runs_uri(self) -> str:
        return f"s3://{self.bucket_name}/{RUNS_PREFIX}"

    def _checkpoints_uri(self, run_id: str) -> str:
        return f"States.Format('s3://{self.bucket_name}/{CHECKPOINTS_PREFIX}{{}}/', {run_id})"

    def _checkpoint_flags(self, job: JobKind) -> list[str]:
        """Where the job's script finds the run's checkpoints (with --run-id from the hyperparameters), and for
        training where an initial model's are (--init-from's run id: beside its own on FSx, else the FSx channel)."""
        shared = f"{FSX_PATH}/{CHECKPOINTS_PREFIX.rstrip('/')}"
        if self.checkpoints_on_fsx:
            return ["--checkpoints-root", shared]
        if job != "train":
            return ["--checkpoint", CHECKPOINTS_INPUT_PATH]
        return [
            "--checkpoint-dir",
            CHECKPOINT_LOCAL_PATH,
            *(["--init-checkpoints-root", shared] if self.file_system else []),
        ]

    @staticmethod
    def _workload_flags(job: JobKind) -> list[str]:
        """A declared workload's folders (user_workload.prepare_run): the checkpoints SageMaker syncs (training) or
        the run's checkpoint channel (validation), the model where SageMaker uploads it, the rest beside it; the
        validation's MODEL_DIR starts as what training left in its own (the model channel, unpacked)."""
        checkpoints = CHECKPOINT_LOCAL_PATH if job == "train" else CHECKPOINTS_INPUT_PATH
        trained = [] if job == "train" else ["--model-archive", MODEL_INPUT_PATH]
        return ["--checkpoint-dir", checkpoints, "--run-dir", WORKLOAD_RUN_DIR, "--model-dir", MODEL_PATH, *trained]

    def _environment(self, job: JobKind, instance: InstanceType, run_id: str) -> dict:
        return {
            **job_environment(
                instance,
                backend="sagemaker",
                environment=self.environment,
                neuron_cc_flags=self.neuron_cc_flags,
                tracking_uri=self.tracking_uri,
            ),
            "RUN_ID.$": run_id,
            "REPORT_PREFIX": self._runs_uri,
            "VERDICT_PREFIX": self._runs_uri,
            # Where an approved model is recorded (the validation registers it in MLflow under this location).
            "MODELS_PREFIX": f"s3://{self.bucket_name}/{MODELS_PREFIX}",
            # Each instance has its own /opt/ml/checkpoints; SageMaker uploads every instance's files to the one
            # CheckpointConfig prefix (launch.py and checkpoint.py finalise each node's own files).
            **({} if self.checkpoints_on_fsx else {"CHECKPOINT_NODE_LOCAL": "1"}),
            **({"SANITY_BEFORE_TRAINING": "1"} if job == "train" else {}),
            **({"FSX_REVISION": self.file_system[2]} if self.file_system else {}),
            # Trainium's compile cache in the file system's channel, where the compile job leaves it for training.
            **({"NEURON_CACHE_ROOT": NEURON_CACHE_ROOT} if self.checkpoints_on_fsx else {}),
        }

    def _channels(self, job: JobKind, parameters: Mapping[str, str]) -> list[dict]:
        """The dataset (FSx or S3) as channel `training`; the run's checkpoints as channel `checkpoints` (validation)
        or, for Neuron, the whole file system as channel `fsx` (training writes there, validation reads)."""
        data = {"ChannelName": DATA_CHANNEL, **self._dataset_source(parameters["dataset"])}
        if self.checkpoints_on_fsx:
            access = "rw" if job in MULTI_NODE_JOBS else "ro"  # training's checkpoints, compile's cache
            return [data, {"ChannelName": FSX_CHANNEL, **self._file_system_source("/", access)}]
        if job == "train":
            # Other runs' checkpoints, for a run that starts from an approved model (FSx imports the bucket's
            # checkpoints/ prefix: the union of each node's uploaded folder): the file system's root, read-only.
            root = [{"ChannelName": FSX_CHANNEL, **self._file_system_source("/", "ro")}] if self.file_system else []
            return [data, *root]
        checkpoints = {
            "ChannelName": CHECKPOINTS_CHANNEL,
            # Streamed: validation reads the newest loadable step's model, not every kept step and optimizer state.
            "InputMode": "FastFile",
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": "S3Prefix",
                    "S3Uri.$": self._checkpoints_uri(parameters["run_id"]),
                    "S3DataDistributionType": "FullyReplicated",
                }
            },
        }
        return [data, checkpoints]

    @staticmethod
    def _model_channel(job: JobKind, declared: bool) -> list[dict]:
        """A declared workload's validation: the training job's model.tar.gz, copied whole to MODEL_INPUT_PATH (File
        mode: "To download the data from Amazon Simple Storage Service (Amazon S3) to the provisioned ML storage
        volume, and mount the directory to a Docker volume, use File input mode", API_Channel InputMode)."""
        if job != "validate" or not declared:
            return []
        source = {"S3DataType": "S3Prefix", "S3Uri.$": TRAINED_MODEL, "S3DataDistributionType": "FullyReplicated"}
        return [{"ChannelName": MODEL_CHANNEL, "InputMode": "File", "DataSource": {"S3DataSource": source}}]

    def _dataset_source(self, dataset: str) -> dict:
        if self.file_system:
            return self._file_system_source(dataset, "ro")
        # Fast file mode streams the objects on first read instead of copying the dataset before the job starts
        # (API_Channel InputMode FastFile).
        return {
            "InputMode": "FastFile",
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": "S3Prefix",
                    "S3Uri.$": f"States.Format('s3://{self.bucket_name}/{{}}', {dataset})",
                    "S3DataDistributionType": "FullyReplicated",
                }
            },
        }

    def _file_system_source(self, path: str, access: str) -> dict:
        """FSx for Lustre in the training subnet's zone at `path` (a JSONPath, or "/" for the root) under the file
        system's mount name (API_FileSystemDataSource DirectoryPath: /<mount name>/<path>)."""
        assert self.file_system is not None
        file_system_id, mount_name, _ = self.file_system
        directory = (
            {"DirectoryPath": f"/{mount_name}"}
            if path == "/"
            else {"DirectoryPath.$": f"States.Format('/{mount_name}/{{}}', {path})"}
        )
        source = {"FileSystemId": file_system_id, "FileSystemType": "FSxLustre", "FileSystemAccessMode": access}
        return {"DataSource": {"FileSystemDataSource": {**source, **directory}}}

    def read_failed_job(self, ends: FailureEnds) -> sfn.State:
        """A failed training job's description (the .sync task's Cause): its FailureReason carries the first
        characters of /opt/ml/output/failure (SageMaker developer guide, "How Amazon SageMaker AI Provides Training
        Information"), where launch.py writes FAILURE_REASON_MARKER and the exit code; no instances is CapacityError.
        A managed Spot job SageMaker stopped at MaxWaitTimeInSeconds (Stopped, SecondaryStatus MaxWaitTimeExceeded, no
        FailureReason: API_DescribeTrainingJob) is an attempt failure: its allowance already held the environment's
        capacity wait (_spot_wait_seconds), and the capacity path asks again every 5 minutes for that long, each ask a
        whole new Spot job, which neither capacity_wait_hours nor the execution's timeout counts."""
        scope, id_ = ends.scope, ends.id_
        reason = "$.job.FailureReason"
        by_reason = sfn.Choice(scope, f"{id_}IsRunRefusedByReason")
        for exit_code in sorted(REFUSED_EXIT_CODES):
            marked = sfn.Condition.string_matches(reason, f"*{FAILURE_REASON_MARKER}{exit_code}:*")
            by_reason.when(marked, ends.refused_with(exit_code))
        by_reason.when(sfn.Condition.string_matches(reason, CAPACITY_REASON), ends.no_capacity)
        window = sfn.Condition.string_matches(reason, f"*{FAILURE_REASON_MARKER}{WINDOW_ENDED_EXIT_CODE}:*")
        by_reason.when(window, ends.window_ended).otherwise(ends.attempt_failed)
        has_reason = sfn.Condition.and_(sfn.Condition.is_present(reason), sfn.Condition.is_string(reason))
        return ends.parsed(
            sfn.Choice(scope, f"{id_}HasReason").when(has_reason, by_reason).otherwise(ends.attempt_failed)
        )

    def quarantine_host(self, scope: Construct, id_: str) -> None:
        """Nothing to take out: each training job, a retry included, runs on instances SageMaker provisions for it
        (the record of a bad host is still kept and shown)."""
        return None

    def grant(self, principal: iam.IGrantable) -> None:
        """Step Functions' documented policy for createTrainingJob.sync (training-job/*: names are made per
        submission), AddTags for the jobs' cost-allocation tags, and passing the jobs' role to SageMaker only."""
        stack = cdk.Stack.of(principal) if isinstance(principal, Construct) else cdk.Stack.of(self.role)
        jobs = stack.format_arn(service="sagemaker", resource="training-job", resource_name="*")
        # This environment's jobs only, by the tag every job is created with (Service Authorization Reference, Amazon
        # SageMaker: CreateTrainingJob and AddTags take aws:RequestTag, the training-job resource aws:ResourceTag);
        # a job that names a training plan is authorized on the plan's ARN too (CreateTrainingJob's resource types
        # include training-plan).
        tagged = {"aws:RequestTag/Environment": self.environment}
        plans = [self.training_plan] if self.training_plan else []
        principal.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["sagemaker:CreateTrainingJob"], resources=[jobs, *plans], conditions={"StringEquals": tagged}
            )
        )
        principal.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(actions=["sagemaker:AddTags"], resources=[jobs], conditions={"StringEquals": tagged})
        )
        principal.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"],
                resources=[jobs],
                conditions={"StringEquals": {"aws:ResourceTag/Environment": self.environment}},
            )
        )
        # The .sync integration's documented policy also lists ListTags on every resource (Step Functions developer
        # guide, "IAM policies for Amazon SageMaker AI": CreateTrainingJob, Run a Job (.sync), dynamic resources).
        iam.Grant.add_to_principal(grantee=principal, actions=["sagemaker:ListTags"], resource_arns=["*"])
        principal.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["iam:PassRole"],
                resources=[self.role.role_arn],
                conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}},
            )
        )
        # The managed rule through which Step Functions learns that a training job ended.
        iam.Grant.add_to_principal(
            grantee=principal,
            actions=["events:PutTargets", "events:PutRule", "events:DescribeRule"],
            resource_arns=[
                stack.format_arn(
                    service="events",
                    resource="rule",
                    resource_name="StepFunctionsGetEventsForSageMakerTrainingJobsRule",
                )
            ],
        )
        role = getattr(principal, "role", None)  # a state machine's role carries the finding
        if isinstance(role, Construct):
            acknowledge(
                role,
                f"AwsSolutions-IAM5[Resource::{shown_arn(stack, 'sagemaker', 'training-job/*')}]",
                "Training job names are made per submission (run id, job, a fresh suffix); the pipeline creates, "
                "describes, tags and stops only the jobs it starts",
            )

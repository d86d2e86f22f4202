"""The training pipeline's real definition, synthesized with the dev app, executed by moto's ASL interpreter
(tests/sfn_emulator.py says what is emulated and why). The construct's template alone: test_training_pipeline.py.
"""

import json

import pytest

from config import load_config
from tests.pipeline.runs import ACCEPTED, REJECTED, RUN, approval, approved_model, messages, queue_of, states
from tests.sfn_emulator import BATCH_HOST_LOST, BATCH_NO_CAPACITY, PREPARED_DATASET
from tests.synthesis import context

pytestmark = pytest.mark.slow  # the pipeline executed in moto (tests/sfn_emulator.py)

# ---- the definition executed --------------------------------------------------------------------


def test_happy_path_records_the_approved_model(emulator):
    emulator.verdict = ACCEPTED
    result = emulator.run(RUN)
    assert result["status"] == "SUCCEEDED", result
    assert emulator.submitted_kinds() == ["sanity", "train", "validate"]
    train = emulator.submitted[1]
    # Per-run values reach Batch as string job Parameters (multi-node jobs take no container overrides); the
    # hyperparameters, defaults merged, as one JSON text, which the launcher turns into the trainer's flags.
    hyperparameters = json.loads(train["parameters"].pop("hyperparameters"))
    assert train["parameters"] == {
        "run_id": "gpt-tiny-001",
        "dataset": "datasets/wikitext/",
        "init_from": "none",  # no init_from: from scratch
        "stop_by": "none",  # the dev environment has no reservation with an end
        "nodes": "2",
    }
    assert hyperparameters == {
        "model": "tiny",
        "max_steps": 500,
        "checkpoint_every": 0,
        "seed": 1337,
        "strategy": "ddp",
        "lr": 0.0006,
        "batch_size": 8,
        "tensor_parallel": 1,
        "pipeline_parallel": 1,
    }
    assert train["retryStrategy"]["attempts"] == 2 and train["retryStrategy"]["evaluateOnExit"][-1]["action"] == "EXIT"
    model = approval(emulator)
    assert model["run_id"] == "gpt-tiny-001" and model["model"].endswith("/models/gpt-tiny-001/")
    assert model["verdict"]["passed"] is True
    copied = emulator.s3.get_object(Bucket=emulator.bucket, Key="models/gpt-tiny-001/verdict.json")
    assert json.loads(copied["Body"].read())["value"] == 3.18
    assert [m["outcome"] for m in messages(emulator)] == ["APPROVED"]


def test_training_failing_once_is_retried_and_succeeds(emulator):
    emulator.verdict = ACCEPTED
    emulator.outcomes = {"train": [False, True]}
    result = emulator.run(RUN)
    assert result["status"] == "SUCCEEDED", result
    assert emulator.submitted_kinds() == ["sanity", "train", "train", "validate"]
    history = emulator.history(result["executionArn"])
    train_failures = [e for e in history if e["type"] == "TaskFailed"]
    assert len(train_failures) == 1 and train_failures[0]["taskFailedEventDetails"]["error"] == "States.TaskFailed"
    assert (
        sum(e["type"] == "TaskScheduled" and "submitJob" in e["taskScheduledEventDetails"]["resource"] for e in history)
        == 4
    )
    # One backoff, with full jitter: anywhere from 0 to the 120 s interval.
    assert len(emulator.retry_sleeps) == 1 and 0 <= emulator.retry_sleeps[0] <= 120
    assert approved_model(emulator) is not None


@pytest.mark.parametrize("exit_code", [2, 4, 5])
def test_training_that_refuses_the_run_is_not_retried_on_new_hosts(emulator, exit_code):
    # Exit 2 (bad input), 4 (diverged), 5 (folder locked): the run itself failed; booting every node again would
    # repeat it. The job's last attempt's exit code (Batch fills a multi-node job's exit information from its
    # main node: Batch user guide, "Multi-node parallel jobs") decides, so one submission and no backoff.
    emulator.outcomes = {"train": [exit_code]}
    result = emulator.run(RUN)
    assert result["status"] == "FAILED" and result.get("error") == "TrainingFailed"
    assert emulator.submitted_kinds() == ["sanity", "train"] and emulator.retry_sleeps == []
    (alert,) = messages(emulator)
    assert alert["detail"] == "TrainingRefused" and f"exited with {exit_code}" in alert["cause"]


def test_training_failing_with_another_exit_code_is_retried(emulator):
    # Exit 1 (an infrastructure or unexpected failure), 143 (stopped by SIGTERM) and 6 (hung: the launcher's watchdog
    # ended it, efa_training/runtime/errors.py EXIT_HUNG) are worth a retry elsewhere.
    emulator.verdict = ACCEPTED
    emulator.outcomes = {"train": [1, 143, 6, 0]}
    assert emulator.run(RUN)["status"] == "SUCCEEDED"
    assert emulator.submitted_kinds() == ["sanity", "train", "train", "train", "train", "validate"]


def test_a_job_its_queue_cancelled_for_capacity_is_waited_for_without_spending_an_attempt(emulator):
    # Batch cancels a job that waited batch_capacity_wait_minutes in RUNNABLE for instances EC2 could not supply
    # (Batch user guide, "Jobs stuck in RUNNABLE due to capacity"): asked again every 5 minutes, not backed off, and
    # the 3 retries of failed attempts are all still there for the failures that follow.
    emulator.verdict = ACCEPTED
    emulator.outcomes = {"sanity": [BATCH_NO_CAPACITY, True], "train": [BATCH_NO_CAPACITY, False, False, False, True]}
    result = emulator.run(RUN)
    assert result["status"] == "SUCCEEDED", result
    assert emulator.submitted_kinds() == ["sanity", "sanity"] + ["train"] * 5 + ["validate"]
    assert emulator.retry_sleeps[:2] == [300, 300] and len(emulator.retry_sleeps) == 5


def test_capacity_that_never_comes_ends_the_run_as_capacity_unavailable(emulator, synth):
    # The dev environment waits capacity_wait_hours=2, each multi-node submission 20 minutes: 5 more asks.
    emulator.outcomes = {"sanity": [BATCH_NO_CAPACITY]}
    result = emulator.run(RUN)
    assert result["status"] == "FAILED" and result.get("error") == "CapacityUnavailable"
    assert emulator.submitted_kinds() == ["sanity"] * (1 + synth().config.capacity_retries) == ["sanity"] * 6
    (alert,) = messages(emulator)
    assert alert["state"] == "SanityCheck" and "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY" in alert["cause"]


def test_training_failing_every_time_notifies_and_fails(emulator):
    emulator.outcomes = {"train": [False]}
    result = emulator.run(RUN)
    assert result["status"] == "FAILED"
    assert result.get("error") == "TrainingFailed"
    assert emulator.submitted_kinds() == ["sanity"] + ["train"] * 4 + []  # first attempt + 3 retries
    assert len(emulator.retry_sleeps) == 3
    (alert,) = messages(emulator)
    assert alert["outcome"] == "FAILED" and alert["error"] == "TrainingFailed" and alert["state"] == "Train"
    assert approved_model(emulator) is None


def test_validation_rejecting_fails_without_approval(emulator):
    emulator.verdict = REJECTED
    result = emulator.run(RUN)
    assert result["status"] == "FAILED"
    assert result.get("error") == "ValidationFailed"
    assert "val_loss" in result.get("cause", "") and "0.05" in result.get("cause", "")
    assert approved_model(emulator) is None
    listed = emulator.s3.list_objects_v2(Bucket=emulator.bucket, Prefix="models/")
    assert listed.get("KeyCount", 0) == 0
    assert [m["outcome"] for m in messages(emulator)] == ["REJECTED"]


@pytest.mark.parametrize("spot_failure", [BATCH_NO_CAPACITY, BATCH_HOST_LOST])
def test_a_validation_spot_had_no_room_for_is_validated_on_demand(emulator, spot_failure):
    # Batch documents no fall-through from a queue's Spot compute environment to another when EC2 has no Spot
    # capacity (its queue cancels the job: "Jobs stuck in RUNNABLE due to capacity"), nor keeps a reclaimed host.
    emulator.verdict = ACCEPTED
    emulator.outcomes = {"validate": [spot_failure, True]}
    result = emulator.run(RUN)
    assert result["status"] == "SUCCEEDED", result
    queues = [job["jobQueue"] for job in emulator.submitted if job["jobName"].endswith("validate")]
    assert [q.rsplit("/", 1)[-1] for q in queues] == [
        "efa-training-dev-single-node",
        "efa-training-dev-single-node-on-demand",
    ]


def test_a_validation_that_fails_by_itself_on_spot_is_not_run_again_on_demand(emulator):
    # Exit 1 is the validation's own failure: on demand it would fail the same way, at the on-demand price.
    emulator.verdict = ACCEPTED
    emulator.outcomes = {"validate": [False, True]}
    result = emulator.run(RUN)
    assert result["status"] == "FAILED" and result.get("error") == "ValidationJobFailed", result
    assert emulator.submitted_kinds() == ["sanity", "train", "validate"]
    assert approved_model(emulator) is None


def test_sanity_failing_twice_stops_before_training(emulator):
    emulator.outcomes = {"sanity": [False]}
    result = emulator.run(RUN)
    assert result["status"] == "FAILED" and result.get("error") == "SanityCheckFailed"
    assert emulator.submitted_kinds() == ["sanity", "sanity"]  # retried once, no training job
    (alert,) = messages(emulator)
    assert alert["error"] == "SanityCheckFailed"


def test_sanity_failing_once_is_retried(emulator):
    emulator.verdict = ACCEPTED
    emulator.outcomes = {"sanity": [False, True]}
    assert emulator.run(RUN)["status"] == "SUCCEEDED"
    assert emulator.submitted_kinds() == ["sanity", "sanity", "train", "validate"]


def test_a_parameter_server_run_reaches_the_train_job_with_its_settings(emulator):
    emulator.verdict = ACCEPTED
    run = {**_ctr(staleness=-1, ps_servers_per_node=2, lr=0.02)}
    result = emulator.run(run)
    assert result["status"] == "SUCCEEDED", result
    parameters = json.loads(emulator.submitted[1]["parameters"]["hyperparameters"])
    assert (parameters["strategy"], parameters["model"]) == ("ps", "ctr-tiny")
    assert (parameters["staleness"], parameters["ps_servers_per_node"]) == (-1, 2)
    # the platform's own jobs, as for the default workload
    assert emulator.submitted[1]["jobDefinition"] == "efa-training-dev-train"


def _with(**changes) -> dict:
    """RUN with top-level changes; a value of DROP removes the field."""
    run = {**RUN, **changes}
    return {k: v for k, v in run.items() if v is not DROP}


def _hyper(**changes) -> dict:
    return {**RUN, "hyperparameters": {**RUN["hyperparameters"], **changes}}


def _ctr(**changes) -> dict:
    """A run of the built-in parameter-server workload."""
    return {**RUN, "workload": "ctr-ps", "hyperparameters": {**RUN["hyperparameters"], **changes}}


DROP = object()
# The tensor-parallel degree's rule, in both refusals (the state machine's and the CLI's): its relations to strategy and
# model (training_image/efa_training/workloads/gpt/workload.json "requires" and "divides").
RELATED = "with strategy fsdp only, a divisor of the model's heads"
RELATED_STAGES = "with strategy fsdp only, a divisor of the model's layers"
# The layout degrees on dev's 2 nodes (its instance's workers each, from the catalogue: g5.12xlarge's 4 GPUs): tp
# inside a node, tp x pp dividing the run's workers. The malformed runs below are written for 4.
DEV_WORKERS = load_config(context()).instance.workers_per_node
LAYOUT = f"hyperparameters is not valid; expected tensor_parallel dividing a node's {DEV_WORKERS} workers"
# Patterns and lengths are checked by a JSONata state inside the JSONPath state machine ("Transforming data with
# JSONata in Step Functions": https://docs.aws.amazon.com/step-functions/latest/dg/transforming-data.html).
# (what is wrong, the execution input, a fragment of the refusal's cause: the field it names)
MALFORMED = [
    # the input's shape
    ("top-level array", [RUN], "the input must be a JSON object"),
    ("top-level empty array", [], "the input must be a JSON object"),
    ("top-level string", "gpt-tiny-001", "the input must be a JSON object"),
    ("top-level null", None, "the input must be a JSON object"),
    ("top-level number", 42, "the input must be a JSON object"),
    ("top-level boolean", True, "the input must be a JSON object"),
    ("hyperparameters a string", _with(hyperparameters="lr=0.1"), "hyperparameters is not valid"),
    ("hyperparameters null", _with(hyperparameters=None), "hyperparameters is not valid"),
    ("hyperparameters an array", _with(hyperparameters=[{"lr": 0.1}]), "hyperparameters is not valid"),
    ("hyperparameters a number", _with(hyperparameters=5), "hyperparameters is not valid"),
    ("unknown top-level field", _with(learning_rate=0.1), "unknown field"),
    ("unknown hyperparameter", _hyper(max_step=10), "unknown field"),
    ("field name in another case", _with(Run_id="x"), "unknown field"),
    # run_id
    ("run_id missing", _with(run_id=DROP), "run_id is missing"),
    ("run_id null", _with(run_id=None), "run_id is missing"),
    ("run_id a number", _with(run_id=123), "run_id is not valid"),
    ("run_id empty", _with(run_id=""), "run_id is not valid"),
    ("run_id with a space", _with(run_id="gpt tiny"), "run_id is not valid"),
    ("run_id with a slash", _with(run_id="gpt/tiny"), "run_id is not valid"),
    ("run_id ..", _with(run_id=".."), "run_id is not valid"),
    ("run_id with a trailing newline", _with(run_id="gpt-tiny\n"), "run_id is not valid"),
    ("run_id with a tab", _with(run_id="gpt\ttiny"), "run_id is not valid"),
    ("run_id with a NUL", _with(run_id="gpt\u0000"), "run_id is not valid"),
    ("run_id non-ASCII letter", _with(run_id="gpt-t\u00efny"), "run_id is not valid"),
    ("run_id full-width letters", _with(run_id="\uff47\uff50\uff54"), "run_id is not valid"),
    ("run_id 41 characters", _with(run_id="a" * 41), "run_id is not valid"),
    ("run_id 120 characters", _with(run_id="a" * 120), "run_id is not valid"),
    ("run_id 200 characters", _with(run_id="r" * 200), "run_id is not valid"),
    ("run_id leading hyphen", _with(run_id="-gpt"), "run_id is not valid"),
    ("run_id trailing hyphen", _with(run_id="gpt-"), "run_id is not valid"),
    ("run_id underscore", _with(run_id="gpt_tiny"), "run_id is not valid"),
    # dataset
    ("dataset missing", _with(dataset=DROP), "dataset is missing"),
    ("dataset null", _with(dataset=None), "dataset is missing"),
    ("dataset a number", _with(dataset=7), "dataset is not valid"),
    ("dataset outside the bucket", _with(dataset="s3://elsewhere/data"), "dataset is not valid"),
    ("dataset climbing out with ..", _with(dataset="datasets/../secrets/"), "dataset is not valid"),
    ("dataset climbing out deeper", _with(dataset="datasets/a/../../b/"), "dataset is not valid"),
    ("dataset the bare prefix", _with(dataset="datasets/"), "dataset is not valid"),
    ("dataset empty segment", _with(dataset="datasets//wikitext/"), "dataset is not valid"),
    ("dataset with a newline", _with(dataset="datasets/wiki\ntext/"), "dataset is not valid"),
    ("dataset with a space", _with(dataset="datasets/wiki text/"), "dataset is not valid"),
    ("dataset absolute path", _with(dataset="/fsx/datasets/wikitext/"), "dataset is not valid"),
    ("dataset prefix in another case", _with(dataset="Datasets/wikitext/"), "dataset is not valid"),
    ("dataset 300 characters", _with(dataset="datasets/" + "a" * 300), "dataset is not valid"),
    # nodes
    ("nodes above the maximum", _with(nodes=3), "nodes is not valid"),
    ("nodes below the fixed size", _with(nodes=1), "nodes is not valid"),  # Batch's job definitions fix it
    ("nodes 2.0", _with(nodes=2.0), "nodes is not valid"),
    ("nodes 1.5", _with(nodes=1.5), "nodes is not valid"),
    ("nodes a string", _with(nodes="2"), "nodes is not valid"),
    ("nodes a boolean", _with(nodes=True), "nodes is not valid"),
    ("nodes zero", _with(nodes=0), "nodes is not valid"),
    ("nodes negative", _with(nodes=-2), "nodes is not valid"),
    ("nodes 1e30", _with(nodes=1e30), "nodes is not valid"),
    # hyperparameters
    ("max_steps 1.5", _hyper(max_steps=1.5), "max_steps is not valid"),
    ("max_steps 1e30", _hyper(max_steps=1e30), "max_steps is not valid"),
    ("max_steps zero", _hyper(max_steps=0), "max_steps is not valid"),
    ("max_steps a string", _hyper(max_steps="500"), "max_steps is not valid"),
    ("batch_size 2.0", _hyper(batch_size=2.0), "batch_size is not valid"),
    ("batch_size too large", _hyper(batch_size=100_000), "batch_size is not valid"),
    ("checkpoint_every negative", _hyper(checkpoint_every=-1), "checkpoint_every is not valid"),
    ("seed negative", _hyper(seed=-1), "seed is not valid"),
    ("seed beyond 32 bits", _hyper(seed=2**40), "seed is not valid"),
    ("seed 1e3 (exponent)", _hyper(seed=1e3), "seed is not valid"),
    ("lr zero", _hyper(lr=0), "lr is not valid"),
    ("lr negative", _hyper(lr=-0.1), "lr is not valid"),
    ("lr a string", _hyper(lr="0.1"), "lr is not valid"),
    ("lr above 1", _hyper(lr=5), "lr is not valid"),
    ("unknown model", _hyper(model="gpt5"), "model is not valid"),
    ("model a number", _hyper(model=125), "model is not valid"),
    ("unknown strategy", _hyper(strategy="zero3"), "strategy is not valid"),
    ("strategy null", _hyper(strategy=None), "strategy is not valid"),
    # the sparse models are the ctr-ps workload's, on parameter servers; the GPT models gpt's, with all-reduce
    ("ps for the gpt workload", _hyper(strategy="ps"), "workload ctr-ps"),
    ("a sparse model for gpt", _hyper(model="ctr-tiny"), "workload ctr-ps"),
    ("a GPT model for ctr-ps", _ctr(model="tiny"), "model is not valid"),
    ("ddp for ctr-ps", _ctr(strategy="ddp"), "strategy is not valid"),
    ("staleness below -1", _ctr(staleness=-2), "staleness is not valid"),
    ("staleness 1.5", _ctr(staleness=1.5), "staleness is not valid"),
    ("ps_servers_per_node zero", _ctr(ps_servers_per_node=0), "ps_servers_per_node is not valid"),
    ("ps_servers_per_node 65", _ctr(ps_servers_per_node=65), "ps_servers_per_node is not valid"),
    ("ps_servers_per_node for gpt", _hyper(ps_servers_per_node=2), "unknown field"),
    # relations between hyperparameters (a declaration's requires and divides: contracts/workload.py)
    ("tensor_parallel with ddp", _hyper(tensor_parallel=2), RELATED),
    ("tensor_parallel not dividing the heads", _hyper(strategy="fsdp", tensor_parallel=8), RELATED),
    ("tensor_parallel 3 for 4 heads", _hyper(strategy="fsdp", tensor_parallel=3), RELATED),
    ("pipeline_parallel with ddp", _hyper(pipeline_parallel=2), RELATED_STAGES),
    ("pipeline_parallel 4 for 2 layers", _hyper(strategy="fsdp", pipeline_parallel=4), RELATED_STAGES),
    # the layout on the environment's workers (a declaration's layout: contracts.run.layout_problem)
    # tp 8 divides the 350m model's 16 heads and dev's 8 workers, not a node's 4: only the node rule refuses it
    ("tensor_parallel 8 across a node's 4 GPUs", _hyper(model="350m", strategy="fsdp", tensor_parallel=8), LAYOUT),
    ("16 ranks a pipeline of 8", _hyper(model="mini", strategy="fsdp", tensor_parallel=4, pipeline_parallel=4), LAYOUT),
    # baseline, tolerance, attempts, resume
    ("baseline null", _with(baseline=None), "baseline is not valid"),
    ("baseline a string", _with(baseline="3.2"), "baseline is not valid"),
    ("baseline a boolean", _with(baseline=True), "baseline is not valid"),
    ("baseline beyond 1e12", _with(baseline=1e300), "baseline is not valid"),
    ("tolerance above 1", _with(tolerance=1.5), "tolerance is not valid"),
    ("tolerance negative", _with(tolerance=-0.1), "tolerance is not valid"),
    ("tolerance a string", _with(tolerance="0.05"), "tolerance is not valid"),
    ("max_attempts zero", _with(max_attempts=0), "max_attempts is not valid"),
    ("max_attempts 11", _with(max_attempts=11), "max_attempts is not valid"),
    ("max_attempts 2.5", _with(max_attempts=2.5), "max_attempts is not valid"),
    ("resume a string", _with(resume="yes"), "resume is not valid"),
    ("resume null", _with(resume=None), "resume is not valid"),
]


@pytest.mark.parametrize("execution_input, cause", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_input_ends_invalid_before_any_job(emulator, execution_input, cause):
    result = emulator.run(execution_input)
    assert result["status"] == "FAILED"
    assert result.get("error") == "InvalidInput" and cause in result.get("cause", ""), result
    assert emulator.submitted == []  # no Batch job
    listed = emulator.s3.list_objects_v2(Bucket=emulator.bucket).get("Contents", [])
    assert [o["Key"] for o in listed] == [f"{PREPARED_DATASET}dataset.json"]  # no run claimed, nothing written
    assert messages(emulator) == []


@pytest.mark.parametrize("execution_input, cause", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_the_cli_contract_refuses_the_same_inputs(execution_input, cause):
    # The CLI validates with the contract the state machine is generated from: it refuses each input too,
    # naming the same field.
    from contracts.run import validate_run

    problems = validate_run(execution_input, max_nodes=2, min_nodes=2, workers_per_node=DEV_WORKERS)
    field = cause.split(" is ")[0]
    assert problems and any(
        field.replace("the input must be a JSON object", "the run must be a JSON object") in problem
        or "unknown" in problem
        for problem in problems
    ), problems


def test_a_tensor_parallel_run_its_relations_allow_passes_the_first_state(emulator):
    # tensor_parallel 2 with strategy fsdp and the tiny model's 4 heads: the relations hold, the run trains with them.
    emulator.verdict = ACCEPTED
    assert emulator.run(_hyper(strategy="fsdp", tensor_parallel=2))["status"] == "SUCCEEDED"
    train = json.loads(emulator.submitted[1]["parameters"]["hyperparameters"])
    assert (train["strategy"], train["tensor_parallel"]) == ("fsdp", 2)


def test_a_pipeline_run_its_layout_allows_passes_the_first_state(emulator):
    # 2 stages of 2-way tensor parallelism on the mini model's 4 layers and 4 heads: 4 of dev's 8 workers a pipeline,
    # 2 replicas of it; the run trains with them.
    emulator.verdict = ACCEPTED
    layout = {"model": "mini", "strategy": "fsdp", "tensor_parallel": 2, "pipeline_parallel": 2}
    assert emulator.run(_hyper(**layout))["status"] == "SUCCEEDED"
    train = json.loads(emulator.submitted[1]["parameters"]["hyperparameters"])
    assert {k: train[k] for k in layout} == layout


def test_defaults_fill_in_what_the_run_omits(emulator):
    emulator.verdict = ACCEPTED
    minimal = {"run_id": "minimal", "dataset": "datasets/wikitext/", "baseline": 3.2}
    assert emulator.run(minimal)["status"] == "SUCCEEDED"
    sanity, train, validate = emulator.submitted
    assert sanity["parameters"] == {"run_id": "minimal", "nodes": "2"}  # nodes: the environment's maximum
    assert json.loads(train["parameters"]["hyperparameters"])["max_steps"] == 1000
    assert validate["parameters"]["tolerance"] == "0.001"
    assert "nodes" not in validate["parameters"]  # single-node


# ---- contracts between the stacks, in the definition ------------------------------------------------


def test_validation_falls_back_to_the_batch_stacks_on_demand_queue_when_spot_has_no_capacity(synth):
    # Batch documents no fall-through between a queue's compute environments when EC2 has no Spot capacity,
    # so a failed Spot attempt is caught and the job is submitted once more, to the Batch stack's on-demand queue.
    template = synth().raw("pipeline")
    (branch,) = states(template)["Validate"]["Branches"]
    on_spot, on_demand = branch["States"]["ValidateOnSpot"], branch["States"]["ValidateOnDemand"]
    assert branch["StartAt"] == "ValidateOnSpot"
    assert on_spot["Catch"][0] == {
        "ErrorEquals": ["States.TaskFailed"],
        "ResultPath": "$.spot_failure",
        "Next": "ValidateIsSpotFailureReadable",
    }
    assert on_spot["Parameters"]["JobDefinition"] == on_demand["Parameters"]["JobDefinition"]
    # The Batch stack's queues by their fixed names (config.layout.batch_name), formatted into ARNs here.
    assert queue_of(template, "ValidateOnDemand").endswith(":job-queue/efa-training-dev-single-node-on-demand")
    assert queue_of(template, "ValidateOnSpot").endswith(":job-queue/efa-training-dev-single-node")


def test_batch_submissions_name_a_share_of_the_fair_share_policy(synth):
    # Fair-share queues reject SubmitJob without a share identifier; the pipeline uses the production share.
    synthesized = synth()
    definition = json.dumps(synthesized.raw("pipeline"))
    shares = [
        s["ShareIdentifier"]
        for policy in synthesized.template("compute").find_resources("AWS::Batch::SchedulingPolicy").values()
        for s in policy["Properties"]["FairsharePolicy"]["ShareDistribution"]
    ]
    assert '\\"ShareIdentifier\\":\\"production\\"' in definition
    assert "production" in shares


def test_the_pipeline_publishes_metrics_only_into_its_own_namespace(synth):
    # Service Authorization Reference, Amazon CloudWatch: PutMetricData has no resource types but takes the condition
    # key cloudwatch:namespace; the run's cost goes to TRAINING_METRICS_NAMESPACE alone.
    from config.layout import TRAINING_METRICS_NAMESPACE

    template = synth().raw("pipeline")
    statements = [
        statement
        for resource in template["Resources"].values()
        if resource["Type"] == "AWS::IAM::Policy"
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]
    ]
    puts = [s for s in statements if "cloudwatch:putmetricdata" in json.dumps(s["Action"]).lower()]
    assert puts and all(
        s.get("Condition") == {"StringEquals": {"cloudwatch:namespace": TRAINING_METRICS_NAMESPACE}} for s in puts
    ), puts

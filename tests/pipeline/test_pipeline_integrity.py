"""Run integrity in the emulated pipeline: a run id names one run (the runs table), and no transient AWS error after
training loses a validated model (tests/sfn_emulator.py runs the synthesized definition in moto)."""

import json
import threading
import time

import boto3
import pytest

from tests.pipeline.runs import (
    ACCEPTED,
    APPROVED_MODEL_PARAMETER,
    RUN,
    approval,
    approved_model,
    hold_run,
    messages,
    run_item,
)
from tests.sfn_emulator import REGION

pytestmark = pytest.mark.slow  # the pipeline executed in moto (tests/sfn_emulator.py)


def started(emulator, execution_input: dict, name: str) -> str:
    return emulator.sfn.start_execution(
        stateMachineArn=emulator.state_machine_arn, name=name, input=json.dumps(execution_input)
    )["executionArn"]


def holder(emulator, run_id: str) -> str:
    """The execution the runs table says holds the run."""
    item = run_item(emulator, run_id)
    assert item is not None, f"{run_id} was never claimed"
    return item["execution"]


def copied_record(emulator, run_id: str) -> dict:
    """runs/<run_id>/run.json: the readable copy of the claim."""
    return json.loads(emulator.s3.get_object(Bucket=emulator.bucket, Key=f"runs/{run_id}/run.json")["Body"].read())


def entered(emulator, execution_arn: str) -> list[str]:
    return [
        e["stateEnteredEventDetails"]["name"]
        for e in emulator.history(execution_arn)
        if "stateEnteredEventDetails" in e
    ]


def task_errors(emulator, execution_arn: str) -> list[str]:
    return [e["taskFailedEventDetails"]["error"] for e in emulator.history(execution_arn) if e["type"] == "TaskFailed"]


def parameter_versions(emulator) -> int:
    return len(emulator.ssm.get_parameter_history(Name=APPROVED_MODEL_PARAMETER)["Parameters"])


# ---- a run id names one run: a conditional write of its item in the runs table ---------------------------------
# DynamoDB API reference, PutItem (attribute_not_exists on the partition key keeps a put from replacing an item; a
# failed condition is ConditionalCheckFailedException):
# https://docs.aws.amazon.com/amazondynamodb/latest/APIReference/API_PutItem.html
# Through Step Functions' optimized integration the error is "DynamoDB.ConditionalCheckFailedException" (prefix
# `DynamoDB`, "Call DynamoDB APIs with Step Functions": https://docs.aws.amazon.com/step-functions/latest/dg/connect-ddb.html).
CONDITION_FAILED = "DynamoDB.ConditionalCheckFailedException"
GONE = "arn:aws:states:us-east-1:123456789012:execution:EfaTraining-dev-Pipeline-TrainingPipeline:gone"


# A second execution with a taken run id fails its conditional put with the documented error and is refused.
def test_a_second_run_with_the_same_id_is_refused_before_any_job(emulator):
    emulator.verdict = ACCEPTED
    first = emulator.run(RUN, name="first")
    assert first["status"] == "SUCCEEDED", first
    emulator.submitted.clear()
    second = emulator.run(RUN, name="second")
    assert (second["status"], second.get("error")) == ("FAILED", "InvalidInput")
    assert "run_id gpt-tiny-001 already names a run" in second["cause"] and '"resume": true' in second["cause"]
    assert task_errors(emulator, second["executionArn"]) == [CONDITION_FAILED]
    assert emulator.submitted == []
    assert holder(emulator, "gpt-tiny-001") == first["executionArn"]  # the first keeps the run
    assert approval(emulator)["execution"] == first["executionArn"]


# The claimed item holds the run's input, the execution and when; the readable copy in S3 says the same.
def test_a_claimed_run_is_recorded_in_the_table_and_copied_to_s3(emulator):
    emulator.verdict = ACCEPTED
    result = emulator.run(RUN, name="recorded")
    item = run_item(emulator, "gpt-tiny-001")
    assert item is not None and item["execution"] == result["executionArn"]
    assert json.loads(item["input"])["dataset"] == RUN["dataset"] and item["since"].startswith("20")
    copy = copied_record(emulator, "gpt-tiny-001")
    assert (copy["execution"], copy["since"], copy["run"]["run_id"]) == (
        item["execution"],
        item["since"],
        "gpt-tiny-001",
    )


# Two executions racing for one run id: DynamoDB lets one put win; the other is refused, one run's jobs only.
def test_two_executions_started_together_with_one_run_id_run_once(emulator):
    emulator.verdict = ACCEPTED
    arns = [started(emulator, RUN, f"together-{i}") for i in range(2)]
    results = [emulator.wait(arn) for arn in arns]
    assert sorted(r["status"] for r in results) == ["FAILED", "SUCCEEDED"], results
    (refused,) = [r for r in results if r["status"] == "FAILED"]
    assert refused["error"] == "InvalidInput" and "already names a run" in refused["cause"]
    assert emulator.submitted_kinds() == ["sanity", "train", "validate"]  # one run's jobs
    assert [m["outcome"] for m in messages(emulator)] == ["APPROVED"]


# Runs from before the runs table are known by what they left.
@pytest.mark.parametrize(
    "key",
    [
        "checkpoints/gpt-tiny-001/step-250/model.pt",
        "runs/gpt-tiny-001/verdict.json",
        "models/gpt-tiny-001/verdict.json",
    ],
)
def test_a_run_id_with_earlier_artifacts_is_refused(emulator, key):
    emulator.s3.put_object(Bucket=emulator.bucket, Key=key, Body=b"{}")
    result = emulator.run(RUN)
    assert (result["status"], result.get("error")) == ("FAILED", "InvalidInput")
    assert "already has checkpoints, a verdict or an approved model" in result["cause"]
    assert emulator.submitted == []


# A failed run is resumed with "resume": true (the item moves to the resuming execution); a plain restart is not.
def test_resume_continues_a_failed_run_and_a_plain_restart_is_refused(emulator):
    emulator.outcomes = {"train": [False]}
    failed = emulator.run(RUN, name="failed")
    assert failed.get("error") == "TrainingFailed"
    emulator.reset()
    emulator.verdict = ACCEPTED
    refused = emulator.run(RUN, name="restart")
    assert refused.get("error") == "InvalidInput" and emulator.submitted == []
    resumed = emulator.run({**RUN, "resume": True}, name="resumed")
    assert resumed["status"] == "SUCCEEDED", resumed
    assert emulator.submitted_kinds() == ["sanity", "train", "validate"]
    assert holder(emulator, "gpt-tiny-001") == resumed["executionArn"]  # taken over
    assert copied_record(emulator, "gpt-tiny-001")["execution"] == resumed["executionArn"]


# A resume while the execution holding the run is RUNNING is refused, naming that execution.
def test_resume_is_refused_while_the_run_is_running(emulator):
    waiting = emulator.sfn.create_state_machine(
        name="still-running",
        roleArn="arn:aws:iam::123456789012:role/x",
        definition=json.dumps({"StartAt": "W", "States": {"W": {"Type": "Wait", "Seconds": 30, "End": True}}}),
    )
    emulator.wait_for_real = True  # the holder's Wait keeps it RUNNING (the emulator records Waits otherwise)
    running = emulator.sfn.start_execution(stateMachineArn=waiting["stateMachineArn"], name="holder")["executionArn"]
    hold_run(emulator, RUN, running)
    try:
        result = emulator.run({**RUN, "resume": True})
    finally:
        emulator.sfn.stop_execution(executionArn=running)
    assert (result["status"], result.get("error")) == ("FAILED", "InvalidInput")
    assert f"is running in execution {running}" in result["cause"]
    assert emulator.submitted == [] and holder(emulator, "gpt-tiny-001") == running


# A resume of a run id the table does not know is refused.
def test_resume_of_an_unknown_run_is_refused(emulator):
    result = emulator.run({**RUN, "run_id": "never-ran", "resume": True})
    assert (result.get("error"), emulator.submitted) == ("InvalidInput", [])
    assert "nothing to resume" in result["cause"]


# Two resumes racing: the other one takes the item over between this one's read and its conditional update, so
# this one's condition (the holder it read) fails with the documented error and it is refused; the winner keeps it.
def test_a_resume_whose_holder_changed_after_it_read_is_refused(emulator, monkeypatch):
    hold_run(emulator, RUN, GONE)
    winner = GONE.replace(":gone", ":the-other-resume")
    next_fault = emulator.next_fault

    def other_resume_first(call: str):
        if call == "dynamodb.update_item":  # the other resume's TakeOverRun, on the holder both read
            boto3.client("dynamodb", region_name=REGION).update_item(
                TableName=emulator.runs_table,
                Key={"run_id": {"S": RUN["run_id"]}},
                UpdateExpression="SET #holder = :winner",
                ConditionExpression="#holder = :previous",
                ExpressionAttributeNames={"#holder": "execution"},
                ExpressionAttributeValues={":winner": {"S": winner}, ":previous": {"S": GONE}},
            )
        return next_fault(call)

    monkeypatch.setattr(emulator, "next_fault", other_resume_first)
    result = emulator.run({**RUN, "resume": True}, name="raced")
    assert (result["status"], result.get("error")) == ("FAILED", "InvalidInput"), result
    assert "was resumed by another execution at the same time" in result["cause"]
    # The holder read is long gone (not running), so the take-over was tried, and its condition failed.
    assert task_errors(emulator, result["executionArn"]) == ["Sfn.ExecutionDoesNotExistException", CONDITION_FAILED]
    assert emulator.submitted == [] and holder(emulator, "gpt-tiny-001") == winner


# Two resumes started together: one trains, the other is refused (by the condition, or by the holder check).
def test_two_resumes_at_once_take_the_run_once(emulator):
    hold_run(emulator, RUN, GONE)
    emulator.verdict = ACCEPTED
    # The first resume holds the run (its sanity job is held RUNNING) while the second one starts: without the
    # hold, a loaded machine could finish the first before the second begins, which is a legitimate later resume.
    emulator.held["sanity"] = threading.Event()
    first = started(emulator, {**RUN, "resume": True}, "resume-0")
    deadline = time.monotonic() + 30
    while not emulator.submitted and time.monotonic() < deadline:
        time.sleep(0.02)
    refused = emulator.wait(started(emulator, {**RUN, "resume": True}, "resume-1"))
    emulator.held["sanity"].set()
    assert emulator.wait(first)["status"] == "SUCCEEDED"
    assert (
        refused["status"] == "FAILED"
        and refused["error"] == "InvalidInput"
        and ("resumed by another execution" in refused["cause"] or "is running in execution" in refused["cause"])
    ), refused
    assert emulator.submitted_kinds() == ["sanity", "train", "validate"]
    assert holder(emulator, "gpt-tiny-001") == first


# The claim's PutItem took effect but its answer was lost (a 500 after the write); the retry's condition then fails
# with the documented error, the item names this execution, so the run goes on, once.
def test_a_claim_whose_answer_was_lost_is_recognised_as_this_runs_own(emulator):
    emulator.verdict = ACCEPTED
    emulator.faults["dynamodb.put_item"] = ["after:InternalServerError"]
    result = emulator.run(RUN)
    assert result["status"] == "SUCCEEDED", result
    assert task_errors(emulator, result["executionArn"]) == ["DynamoDB.InternalServerError", CONDITION_FAILED]
    states = entered(emulator, result["executionArn"])
    assert "ClaimRunReadBack" in states and "RunIdTaken" not in states
    assert emulator.submitted_kinds() == ["sanity", "train", "validate"] and parameter_versions(emulator) == 1


# The same for a resume's take-over: its UpdateItem took effect, its answer was lost, the retry's condition fails,
# and the item already names this execution: the resume goes on.
def test_a_take_over_whose_answer_was_lost_is_recognised_as_this_runs_own(emulator):
    hold_run(emulator, RUN, GONE)
    emulator.verdict = ACCEPTED
    emulator.faults["dynamodb.update_item"] = ["after:InternalServerError"]
    result = emulator.run({**RUN, "resume": True})
    assert result["status"] == "SUCCEEDED", result
    states = entered(emulator, result["executionArn"])
    assert "TakeOverRunReadBack" in states and "RunResumedElsewhere" not in states
    assert holder(emulator, "gpt-tiny-001") == result["executionArn"]
    assert emulator.submitted_kinds() == ["sanity", "train", "validate"]


# ---- nothing after training is lost to a transient error -------------------------------------------------
# Error names `ServiceName.ErrorName` (https://docs.aws.amazon.com/step-functions/latest/dg/supported-services-awssdk.html);
# Retry with JitterStrategy FULL (https://docs.aws.amazon.com/step-functions/latest/dg/concepts-error-handling.html).

TRANSIENT: list[tuple[str, list[str | None]]] = [
    ("s3.get_object", ["SlowDown"]),  # reading the verdict
    ("s3.get_object", ["ServiceUnavailable", "InternalError", "SlowDown"]),  # three in a row
    ("s3.copy_object", ["InternalError"]),  # copying the verdict to models/
    ("s3.put_object", [None, "SlowDown"]),  # recording the approval (the first put is the claim's copy)
    ("s3.put_object", ["SlowDown"]),  # the claim's readable copy
    # Claiming the run; DynamoDB developer guide, "Error handling with DynamoDB" (500 and throttling errors).
    ("dynamodb.put_item", ["InternalServerError"]),
    ("dynamodb.put_item", ["ProvisionedThroughputExceededException", "InternalServerError"]),
    ("s3.list_objects_v2", ["SlowDown"]),  # looking for an earlier run's artifacts
    ("ssm.put_parameter", ["ThrottlingException"]),  # publishing the approved model
    ("ssm.put_parameter", ["ThrottlingException", "InternalFailure"]),
    ("sns.publish", ["Throttling"]),  # notifying the approval
]


@pytest.mark.parametrize("call, faults", TRANSIENT, ids=[f"{c}:{'+'.join(map(str, f))}" for c, f in TRANSIENT])
def test_a_transient_fault_after_validation_is_absorbed(emulator, call, faults):
    emulator.verdict = ACCEPTED
    emulator.faults[call] = list(faults)
    result = emulator.run(RUN)
    assert result["status"] == "SUCCEEDED", result
    assert emulator.faulted == [f"{call}:{fault}" for fault in faults if fault]  # the faults did happen
    assert emulator.submitted_kinds() == ["sanity", "train", "validate"]  # nothing trained twice
    assert parameter_versions(emulator) == 1  # one approval
    assert approval(emulator)["execution"] == result["executionArn"]
    assert [m["outcome"] for m in messages(emulator)] == ["APPROVED"]


def test_an_approval_is_recorded_once_and_a_resume_publishes_the_same_one(emulator):
    emulator.verdict = ACCEPTED
    first = emulator.run(RUN, name="approved")
    recorded = json.loads(
        emulator.s3.get_object(Bucket=emulator.bucket, Key="models/gpt-tiny-001/approval.json")["Body"].read()
    )
    emulator.reset()
    emulator.verdict = ACCEPTED
    again = emulator.run({**RUN, "resume": True}, name="resumed-after-approval")
    assert again["status"] == "SUCCEEDED", again
    # The resumed execution found the approval recorded and published that one, not a new one.
    assert approved_model(emulator) == recorded
    assert recorded["execution"] == first["executionArn"]


def test_an_approval_a_job_wrote_before_the_pipeline_is_never_adopted(emulator):
    # On Batch and EKS a job can write models/<run_id>/approval.json through /fsx (the data repository association
    # exports it): the pipeline records its own approval in the runs table and writes the copy over the forgery.
    forged = {"run_id": RUN["run_id"], "model": "s3://elsewhere/", "verdict": {**ACCEPTED, "value": 0.1},
              "execution": "arn:aws:states:us-east-1:123456789012:execution:pipeline:forged"}  # fmt: skip
    key = f"models/{RUN['run_id']}/approval.json"
    emulator.verdict = ACCEPTED
    emulator.held["validate"] = threading.Event()  # the forgery lands while the run's validation runs
    execution = started(emulator, RUN, "forged-approval")
    deadline = time.monotonic() + 30
    while "validate" not in emulator.submitted_kinds() and time.monotonic() < deadline:
        time.sleep(0.02)
    emulator.s3.put_object(Bucket=emulator.bucket, Key=key, Body=json.dumps(forged).encode())
    emulator.held["validate"].set()
    result = emulator.wait(execution)
    assert result["status"] == "SUCCEEDED", result
    published = approval(emulator)
    assert published["execution"] == result["executionArn"] and published["verdict"]["value"] == ACCEPTED["value"]
    assert json.loads(emulator.s3.get_object(Bucket=emulator.bucket, Key=key)["Body"].read()) == published
    item = run_item(emulator, RUN["run_id"])
    assert item is not None and json.loads(item["approval"]) == published


def test_a_notification_that_keeps_failing_does_not_fail_an_approved_run(emulator):
    emulator.verdict = ACCEPTED
    emulator.faults["sns.publish"] = ["Throttling"] * 6  # every attempt
    result = emulator.run(RUN)
    assert result["status"] == "SUCCEEDED", result
    assert approval(emulator)["run_id"] == RUN["run_id"]
    assert messages(emulator) == []

"""Run integrity in the emulated pipeline: a run id names one run, and no transient AWS error after training
loses a validated model (tests/sfn_emulator.py runs the synthesized definition in moto)."""

import json
import threading
import time

import pytest

from tests.pipeline.runs import ACCEPTED, APPROVED_MODEL_PARAMETER, RUN, approval, approved_model, messages


def started(emulator, execution_input: dict, name: str) -> str:
    return emulator.sfn.start_execution(
        stateMachineArn=emulator.state_machine_arn, name=name, input=json.dumps(execution_input)
    )["executionArn"]


def record(emulator, run_id: str) -> dict:
    return json.loads(emulator.s3.get_object(Bucket=emulator.bucket, Key=f"runs/{run_id}/run.json")["Body"].read())


def parameter_versions(emulator) -> int:
    return len(emulator.ssm.get_parameter_history(Name=APPROVED_MODEL_PARAMETER)["Parameters"])


# ---- a run id names one run (S3 conditional writes: If-None-Match / If-Match) ---------------------------
# S3 user guide, "Add preconditions to S3 operations with conditional requests":
# https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-requests.html


def test_a_second_run_with_the_same_id_is_refused_before_any_job(emulator):
    emulator.verdict = ACCEPTED
    first = emulator.run(RUN, name="first")
    assert first["status"] == "SUCCEEDED", first
    emulator.submitted.clear()
    second = emulator.run(RUN, name="second")
    assert (second["status"], second.get("error")) == ("FAILED", "InvalidInput")
    assert "run_id gpt-tiny-001 already names a run" in second["cause"] and '"resume": true' in second["cause"]
    assert emulator.submitted == []
    assert record(emulator, "gpt-tiny-001")["execution"] == first["executionArn"]  # the first keeps the run
    assert approval(emulator)["execution"] == first["executionArn"]


def test_two_executions_started_together_with_one_run_id_run_once(emulator):
    emulator.verdict = ACCEPTED
    arns = [started(emulator, RUN, f"together-{i}") for i in range(2)]
    results = [emulator.wait(arn) for arn in arns]
    assert sorted(r["status"] for r in results) == ["FAILED", "SUCCEEDED"], results
    (refused,) = [r for r in results if r["status"] == "FAILED"]
    assert refused["error"] == "InvalidInput" and "already names a run" in refused["cause"]
    assert emulator.submitted_kinds() == ["sanity", "train", "validate"]  # one run's jobs
    assert [m["outcome"] for m in messages(emulator)] == ["APPROVED"]


@pytest.mark.parametrize(
    "key",
    [
        "checkpoints/gpt-tiny-001/step-250/model.pt",
        "runs/gpt-tiny-001/verdict.json",
        "models/gpt-tiny-001/verdict.json",
    ],
)
def test_a_run_id_with_earlier_artifacts_is_refused(emulator, key):
    # Runs from before the run record existed are known by what they left.
    emulator.s3.put_object(Bucket=emulator.bucket, Key=key, Body=b"{}")
    result = emulator.run(RUN)
    assert (result["status"], result.get("error")) == ("FAILED", "InvalidInput")
    assert "already has checkpoints, a verdict or an approved model" in result["cause"]
    assert emulator.submitted == []


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
    assert record(emulator, "gpt-tiny-001")["execution"] == resumed["executionArn"]  # taken over


def test_resume_is_refused_while_the_run_is_running(emulator):
    # The run's record names an execution that is still running (a waiting state machine stands in for it).
    waiting = emulator.sfn.create_state_machine(
        name="still-running",
        roleArn="arn:aws:iam::123456789012:role/x",
        definition=json.dumps({"StartAt": "W", "States": {"W": {"Type": "Wait", "Seconds": 30, "End": True}}}),
    )
    holder = emulator.sfn.start_execution(stateMachineArn=waiting["stateMachineArn"], name="holder")["executionArn"]
    emulator.s3.put_object(
        Bucket=emulator.bucket,
        Key="runs/gpt-tiny-001/run.json",
        Body=json.dumps({"execution": holder, "run": RUN}).encode(),
    )
    try:
        result = emulator.run({**RUN, "resume": True})
    finally:
        emulator.sfn.stop_execution(executionArn=holder)
    assert (result["status"], result.get("error")) == ("FAILED", "InvalidInput")
    assert f"is running in execution {holder}" in result["cause"]
    assert emulator.submitted == []


def test_resume_of_an_unknown_run_is_refused(emulator):
    result = emulator.run({**RUN, "run_id": "never-ran", "resume": True})
    assert (result.get("error"), emulator.submitted) == ("InvalidInput", [])
    assert "nothing to resume" in result["cause"]


def test_two_resumes_at_once_take_the_run_once(emulator):
    emulator.s3.put_object(
        Bucket=emulator.bucket,
        Key="runs/gpt-tiny-001/run.json",
        Body=json.dumps(
            {
                "execution": "arn:aws:states:us-east-1:123456789012:execution:"
                "EfaTraining-dev-Pipeline-TrainingPipeline:gone",
                "run": RUN,
            }
        ).encode(),
    )
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
    # Refused either by the conditional write (both read the same record) or by the holder check.
    assert (
        refused["status"] == "FAILED"
        and refused["error"] == "InvalidInput"
        and ("resumed by another execution" in refused["cause"] or "is running in execution" in refused["cause"])
    ), refused
    assert emulator.submitted_kinds() == ["sanity", "train", "validate"]


# ---- nothing after training is lost to a transient error -------------------------------------------------
# Error names `ServiceName.ErrorName` (https://docs.aws.amazon.com/step-functions/latest/dg/supported-services-awssdk.html);
# Retry with JitterStrategy FULL (https://docs.aws.amazon.com/step-functions/latest/dg/concepts-error-handling.html).

TRANSIENT: list[tuple[str, list[str | None]]] = [
    ("s3.get_object", ["SlowDown"]),  # reading the verdict
    ("s3.get_object", ["ServiceUnavailable", "InternalError", "SlowDown"]),  # three in a row
    ("s3.copy_object", ["InternalError"]),  # copying the verdict to models/
    ("s3.put_object", [None, "SlowDown"]),  # recording the approval (the first put is the run's claim)
    ("s3.put_object", ["SlowDown"]),  # claiming the run
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


def test_a_notification_that_keeps_failing_does_not_fail_an_approved_run(emulator):
    emulator.verdict = ACCEPTED
    emulator.faults["sns.publish"] = ["Throttling"] * 6  # every attempt
    result = emulator.run(RUN)
    assert result["status"] == "SUCCEEDED", result
    assert approval(emulator)["run_id"] == RUN["run_id"]
    assert messages(emulator) == []


def test_a_claim_whose_answer_was_lost_is_recognised_as_this_runs_own(emulator):
    # The claim's PutObject took effect but its answer was lost; the retry's If-None-Match then fails with 412
    # (S3 user guide, conditional requests). The record names this execution, so the run goes on, once.
    emulator.verdict = ACCEPTED
    emulator.faults["s3.put_object"] = ["after:InternalError"]
    result = emulator.run(RUN)
    assert result["status"] == "SUCCEEDED", result
    entered = [
        e["stateEnteredEventDetails"]["name"]
        for e in emulator.history(result["executionArn"])
        if "stateEnteredEventDetails" in e
    ]
    assert "ClaimRunReadBack" in entered and "RunIdTaken" not in entered
    assert emulator.submitted_kinds() == ["sanity", "train", "validate"] and parameter_versions(emulator) == 1

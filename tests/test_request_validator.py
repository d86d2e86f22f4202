"""tests/request_validator.py finds what botocore's own validation lets through: enums, patterns, maximums."""

import copy
from typing import Any

import pytest

from tests.request_validator import assert_valid, check

# A valid CreateTrainingJob request (API_CreateTrainingJob), in boto member names.
GOOD: dict[str, Any] = {
    "TrainingJobName": "gpt-tiny-001-train-1a2b3c",
    "RoleArn": "arn:aws:iam::123456789012:role/sagemaker-training",
    "AlgorithmSpecification": {
        "TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/training:latest",
        "TrainingInputMode": "File",
    },
    "InputDataConfig": [
        {
            "ChannelName": "train",
            "InputMode": "File",
            "DataSource": {
                "FileSystemDataSource": {
                    "FileSystemId": "fs-0123456789abcdef0",
                    "FileSystemAccessMode": "ro",
                    "FileSystemType": "FSxLustre",
                    "DirectoryPath": "/abcdefgh/datasets",
                }
            },
        }
    ],
    "OutputDataConfig": {"S3OutputPath": "s3://bucket/models/"},
    "ResourceConfig": {"InstanceType": "ml.g5.12xlarge", "InstanceCount": 2, "VolumeSizeInGB": 100},
    "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
    "HyperParameters": {"run_id": "gpt-tiny-001"},
}


def bad_request() -> dict[str, Any]:
    """The request of issue 32: botocore's own validation lets every one of these through."""
    request = copy.deepcopy(GOOD)
    request["AlgorithmSpecification"]["TrainingInputMode"] = "Filez"
    request["InputDataConfig"][0]["InputMode"] = "FastFiles"
    request["InputDataConfig"][0]["DataSource"]["FileSystemDataSource"]["FileSystemType"] = "Lustre"
    request["TrainingJobName"] = "a training job name with spaces " + "x" * 77  # 109 characters
    request["StoppingCondition"]["MaxRuntimeInSeconds"] = 10**12
    return request


def problems_at(request: dict[str, Any], path: str) -> list[str]:
    return [p for p in check("sagemaker", "CreateTrainingJob", request) if p.startswith(f"CreateTrainingJob.{path} =")]


def test_a_valid_request_has_no_problem():
    assert check("sagemaker", "CreateTrainingJob", GOOD) == []
    assert_valid("sagemaker", "CreateTrainingJob", GOOD)


def test_botocore_alone_lets_the_bad_request_through():
    assert not [p for p in check("sagemaker", "CreateTrainingJob", bad_request()) if p.startswith("botocore:")]


@pytest.mark.parametrize(
    ("path", "rule"),
    [
        ("AlgorithmSpecification.TrainingInputMode", "values of enum TrainingInputMode"),
        ("InputDataConfig[0].InputMode", "values of enum TrainingInputMode"),
        ("InputDataConfig[0].DataSource.FileSystemDataSource.FileSystemType", "values of enum FileSystemType"),
        ("TrainingJobName", "does not fully match pattern"),
        ("TrainingJobName", "109 characters, over max 63"),
    ],
)
def test_the_bad_request_is_refused_naming_each_field(path, rule):
    problems = check("sagemaker", "CreateTrainingJob", bad_request())
    assert [p for p in problems if p.startswith(f"CreateTrainingJob.{path} =") and rule in p], problems


def test_the_bad_request_fails_assert_valid_with_every_problem():
    with pytest.raises(AssertionError) as refused:
        assert_valid("sagemaker", "CreateTrainingJob", bad_request())
    assert len(str(refused.value).splitlines()) == 1 + 5


def test_a_number_over_its_maximum():
    stopping = {"MaxRuntimeInSeconds": 86400, "MaxPendingTimeInSeconds": 10**12}  # at most 2419200 (28 days)
    problems = problems_at({**GOOD, "StoppingCondition": stopping}, "StoppingCondition.MaxPendingTimeInSeconds")
    assert [p for p in problems if "over max 2419200 (MaxPendingTimeInSeconds)" in p], problems


def test_a_maximum_the_model_does_not_give_is_not_checked():
    # botocore's model gives MaxRuntimeInSeconds a minimum of 1 and no maximum, so 10**12 passes here: a limit only
    # the service knows. Should the model gain one, this fails: then add the field to the bad request's problems.
    assert problems_at(bad_request(), "StoppingCondition.MaxRuntimeInSeconds") == []


def test_a_pattern_must_match_the_whole_value():
    # TrainingJobName's pattern ^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62} has no $: a search would accept this prefix.
    assert problems_at({**GOOD, "TrainingJobName": "job name"}, "TrainingJobName")


def test_a_list_over_its_maximum():
    channel = GOOD["InputDataConfig"][0]
    channels = [{**channel, "ChannelName": f"c{i}"} for i in range(21)]  # InputDataConfig: at most 20 channels
    assert [p for p in problems_at({**GOOD, "InputDataConfig": channels}, "InputDataConfig") if "21 items" in p]


def test_a_map_key_is_checked():
    # HyperParameters keys: at most 256 characters, pattern .*
    problems = problems_at({**GOOD, "HyperParameters": {"k" * 257: "v"}}, "HyperParameters key")
    assert [p for p in problems if "257 characters, over max 256 (HyperParameterKey)" in p], problems


def test_botocores_own_validation_is_part_of_the_check():
    request = {k: v for k, v in GOOD.items() if k != "RoleArn"}
    assert [p for p in check("sagemaker", "CreateTrainingJob", request) if "RoleArn" in p and "botocore" in p]


def test_a_java_only_pattern_is_translated():
    # StartExecution's traceHeader: \p{ASCII}* is Java only; translated, it still refuses a non-ASCII character.
    request = {"stateMachineArn": "arn:aws:states:us-east-1:123456789012:stateMachine:p", "traceHeader": "Root=1"}
    assert check("stepfunctions", "StartExecution", request) == []
    (problem,) = check("stepfunctions", "StartExecution", {**request, "traceHeader": "Root=é"})
    assert problem.startswith("StartExecution.traceHeader = ") and "does not fully match pattern" in problem

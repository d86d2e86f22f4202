"""The pipeline's AWS SDK integration calls name only request members of their API (botocore's model, the one the
SDKs are built from), so a misspelt parameter fails here and not in an account; and the approval's conditional write
is DynamoDB's (constructs/pipeline/approval_record.py RecordApproval)."""

import functools

import botocore.session
import pytest
from botocore.model import Shape, StructureShape

from tests.pipeline.runs import states

# aws-sdk:<service> names that are not botocore's
SERVICES = {"sfn": "stepfunctions"}
_SESSION = botocore.session.get_session()


@pytest.fixture(scope="module")
def calls(synth) -> dict[str, dict]:
    """State name -> its AWS SDK integration Task (`arn:aws:states:::aws-sdk:<service>:<action>`)."""
    found = states(synth().raw("pipeline"))
    return {name: state for name, state in found.items() if ":aws-sdk:" in state.get("Resource", "")}


@functools.cache
def _input(resource: str) -> StructureShape:
    service, action = resource.split(":aws-sdk:")[1].split(":")[:2]
    model = _SESSION.get_service_model(SERVICES.get(service, service))
    shape = model.operation_model(_pascal(action.split(".")[0])).input_shape
    assert isinstance(shape, StructureShape), resource
    return shape


def _pascal(name: str) -> str:
    """A camelCase member (Step Functions' own API: executionArn) as Step Functions spells it (ExecutionArn)."""
    return name[0].upper() + name[1:]


def _unknown(parameters: dict, shape: Shape, at: str) -> list[str]:
    """The keys of `parameters` (JSONPath `.$` suffix dropped) that are not members of `shape`, into structures."""
    if not isinstance(shape, StructureShape) or not isinstance(parameters, dict):
        return []
    problems, members = [], {_pascal(m): shape for m, shape in shape.members.items()}
    for key, value in parameters.items():
        name = key.removesuffix(".$")
        member = members.get(name)
        if member is None:
            problems.append(f"{at}.{name}: not a member of {shape.name} (members: {', '.join(shape.members)})")
        else:
            problems += _unknown(value, member, f"{at}.{name}")
    return problems


def test_every_sdk_call_names_only_members_of_its_apis_request(calls):
    # "Learning to use AWS service SDK integrations in Step Functions": "Parameters in Step Functions are expressed
    # in PascalCase, even if the native service API is in camelCase": the API's member names, as in botocore's model.
    assert "WriteApprovalCopy" in calls and "RegisterApprovedModel" in calls
    problems = []
    for name, state in calls.items():
        parameters = state.get("Parameters", state.get("Arguments", {}))
        if isinstance(parameters, dict):  # a JSONata expression for the whole input is checked by the emulator
            problems += _unknown(parameters, _input(state["Resource"]), name)
    assert problems == []


def test_the_approval_is_recorded_only_where_none_is(synth):
    # DynamoDB developer guide, "Condition expressions": the update fails ConditionalCheckFailedException where the
    # run's item is missing or already holds an approval (then the recorded one is read back and published).
    record = states(synth().raw("pipeline"))["RecordApproval"]
    assert record["Resource"].endswith(":states:::dynamodb:updateItem")
    parameters = record["Parameters"]
    assert parameters["ConditionExpression"] == "attribute_exists(run_id) AND attribute_not_exists(#approval)"
    assert parameters["ExpressionAttributeNames"] == {"#approval": "approval"}
    assert parameters["UpdateExpression"] == "SET #approval = :approval"

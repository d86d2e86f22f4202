"""tools/capacity.py, `make capacity`: offerings found through the APIs' own shapes (botocore's Stubber checks every
request and response against the service model), durations swept, ranked per instance-hour."""

from datetime import UTC, datetime

import boto3
import pytest
from botocore.stub import ANY, Stubber

from tools import capacity

START = datetime(2026, 12, 1, 11, 30, tzinfo=UTC)


class Session:
    """A boto3 session whose clients are stubbed: `stubs[service]` holds the recorded answers."""

    def __init__(self) -> None:
        self.stubs: dict[str, Stubber] = {}
        self._session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing")

    def client(self, service: str, region_name: str):
        if service not in self.stubs:
            self.stubs[service] = Stubber(self._session.client(service, region_name=region_name))
            self.stubs[service].activate()
        return self.stubs[service].client

    def stub(self, service: str, region: str = "us-west-2") -> Stubber:
        self.client(service, region)
        return self.stubs[service]


def _block(offering: str, hours: int, fee: str, zone: str = "us-west-2b", instances: int = 4) -> dict:
    return {
        "CapacityBlockOfferingId": offering,
        "InstanceType": "p5.48xlarge",
        "AvailabilityZone": zone,
        "InstanceCount": instances,
        "StartDate": START,
        "EndDate": START,
        "CapacityBlockDurationHours": hours,
        "UpfrontFee": fee,
        "CurrencyCode": "USD",
        "Tenancy": "default",
    }


def test_block_durations_are_the_shortest_the_api_sells_that_hold_the_run():
    # 1-day steps up to 14 days, then 7-day steps (EC2 API reference, CapacityDurationHours).
    assert capacity.block_durations(60) == [72, 96, 120]
    assert capacity.block_durations(14 * 24) == [336, 504, 672]
    assert capacity.block_durations(183 * 24) == []


def test_capacity_blocks_are_swept_over_durations_and_ranked_by_what_the_run_pays(capsys):
    session = Session()
    ec2 = session.stub("ec2")
    asked = {"InstanceType": "p5.48xlarge", "InstanceCount": 4, "CapacityDurationHours": ANY}
    # 3 days: one block at $31.46/instance-hour; 4 days: cheaper per instance-hour, dearer in all; 5 days: none.
    ec2.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": [_block("cb-3d", 72, "9060.48")]},
                     asked)  # fmt: skip
    ec2.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": [_block("cb-4d", 96, "11520.00")]},
                     asked)  # fmt: skip
    ec2.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": []}, asked)
    assert capacity.main(["--env", "prod", "--hours", "60"], session=session) == 0
    ec2.assert_no_pending_responses()
    out = capsys.readouterr().out
    assert out.index("cb-3d") < out.index("cb-4d")  # $9,060.48 for the run before $11,520.00
    assert "9,060.48" in out and "31.46" in out and "30.00" in out
    assert "aws ec2 purchase-capacity-block --capacity-block-offering-id cb-3d" in out
    assert '"kind": "capacity_block"' in out and '"zone": "us-west-2b"' in out


def test_training_plans_are_searched_for_sagemaker_training_jobs(capsys):
    session = Session()
    sagemaker = session.stub("sagemaker")
    offer = {
        "TrainingPlanOfferingId": "tpo-1",
        "TargetResources": ["training-job"],
        "DurationHours": 72,
        "UpfrontFee": "8640",
        "CurrencyCode": "USD",
        "ReservedCapacityOfferings": [
            {"InstanceType": "ml.p5.48xlarge", "InstanceCount": 4, "AvailabilityZone": "us-west-2b",
             "DurationHours": 72, "StartTime": START, "EndTime": START}
        ],
    }  # fmt: skip
    asked = {
        "InstanceType": "ml.p5.48xlarge",
        "InstanceCount": 4,
        "DurationHours": ANY,
        "TargetResources": ["training-job"],
    }
    sagemaker.add_response("search_training_plan_offerings", {"TrainingPlanOfferings": [offer]}, asked)
    for _ in range(2):
        sagemaker.add_response("search_training_plan_offerings", {"TrainingPlanOfferings": []}, asked)
    assert capacity.main(["--env", "prod", "--hours", "72", "-c", "compute=sagemaker"], session=session) == 0
    out = capsys.readouterr().out
    assert "tpo-1" in out and "30.00" in out and "create-training-plan" in out and '"kind": "training_plan"' in out


def test_no_offering_says_so_and_how_to_widen_the_search(capsys):
    session = Session()
    for _ in range(3):
        session.stub("ec2").add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": []})
    assert capacity.main(["--env", "prod", "--hours", "24", "--after", "2026-12-01"], session=session) == 1
    assert "no offering holds 4 x p5.48xlarge in us-west-2 (batch) for 24 hours" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--env", "prod", "--hours", "0"], "--hours=0 is not valid"),
        (["--env", "nowhere", "--hours", "24"], "env='nowhere' is not valid"),
    ],
)
def test_a_bad_request_is_one_line(capsys, argv, said):
    assert capacity.main(argv, session=Session()) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1


def test_an_aws_refusal_is_one_line(capsys):
    session = Session()
    session.stub("ec2").add_client_error("describe_capacity_block_offerings", "UnauthorizedOperation")
    assert capacity.main(["--env", "prod", "--hours", "24"], session=session) == 2
    assert capsys.readouterr().err.startswith("error: AWS refused the search (ClientError")

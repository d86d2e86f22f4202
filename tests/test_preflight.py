"""tools/preflight.py and `make destroy`: what a deploy or a destroy asks AWS first, each refusal one line."""

import json
import re

import pytest

from tools import deploy, destroy, preflight

REGION = "us-east-1"


def _versions(status: str) -> dict:
    return {"clusterVersions": [{"clusterVersion": "1.36", "versionStatus": status}]}


def _addon(default: str) -> dict:
    build = {"addonVersion": default, "compatibilities": [{"clusterVersion": "1.36", "defaultVersion": True}]}
    older = {"addonVersion": "v1.17.0-eksbuild.1", "compatibilities": [{"clusterVersion": "1.36"}]}
    return {"addons": [{"addonName": "vpc-cni", "addonVersions": [older, build]}]}


def test_a_kubernetes_version_out_of_standard_support_is_refused(stubbed):
    # EKS API reference, DescribeClusterVersions: versionStatus STANDARD_SUPPORT | EXTENDED_SUPPORT | UNSUPPORTED.
    stubbed("eks").add_response("describe_cluster_versions", _versions("EXTENDED_SUPPORT"))
    with pytest.raises(preflight.PreflightError, match="does not offer Kubernetes 1.36 in standard support"):
        preflight.check_kubernetes(REGION, "1.36", {"vpc-cni": "1.18.5"})


def test_a_default_vpc_cni_older_than_efa_needs_is_refused(stubbed):
    # vpc-cni 1.18.5 is the first to attach `efa-only` interfaces (EKS user guide, EFA).
    eks = stubbed("eks")
    eks.add_response("describe_cluster_versions", _versions("STANDARD_SUPPORT"))
    eks.add_response("describe_addon_versions", _addon("v1.18.4-eksbuild.1"))
    with pytest.raises(preflight.PreflightError, match="default vpc-cni .* is v1.18.4-eksbuild.1"):
        preflight.check_kubernetes(REGION, "1.36", {"vpc-cni": "1.18.5"})
    eks.add_response("describe_cluster_versions", _versions("STANDARD_SUPPORT"))
    eks.add_response("describe_addon_versions", _addon("v1.20.1-eksbuild.3"))
    preflight.check_kubernetes(REGION, "1.36", {"vpc-cni": "1.18.5"})


def test_the_templates_bootstrap_version_is_read_from_the_assembly(synth):
    # The default synthesizer writes the version each stack needs into the manifest (requiresBootstrapStackVersion).
    required = preflight.required_bootstrap_version(synth().outdir)
    assert required >= 6
    with pytest.raises(preflight.PreflightError, match=f"is version 5, and these templates need {required}"):
        preflight.check_bootstrap(5, required, "123456789012", REGION)
    preflight.check_bootstrap(required, required, "123456789012", REGION)


def _stack(name: str, outputs: dict) -> dict:
    described: dict = {"StackName": name, "CreationTime": "2026-11-01T00:00:00Z", "StackStatus": "UPDATE_COMPLETE"}
    described["Outputs"] = [{"OutputKey": k, "OutputValue": v} for k, v in outputs.items()]
    return {"Stacks": [described]}


def test_only_stacks_whose_template_differs_count_as_changed(stubbed, tmp_path):
    manifest = {name: {"properties": {"templateFile": f"{name}.json"}} for name in ("A", "B")}
    (tmp_path / "manifest.json").write_text(json.dumps({"artifacts": manifest}))
    for name in ("A", "B"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"Resources": {"R": {"Type": name}}}))
    cfn = stubbed("cloudformation")
    cfn.add_response("describe_stacks", _stack("A", {}))
    cfn.add_response("get_template", {"TemplateBody": json.dumps({"Resources": {"R": {"Type": "A"}}})})
    cfn.add_response("describe_stacks", _stack("B", {}))
    cfn.add_response("get_template", {"TemplateBody": json.dumps({"Resources": {"R": {"Type": "old"}}})})
    assert preflight.changed_stacks(REGION, tmp_path, ["A", "B", "not-synthesized"]) == ["B"]


def test_a_run_in_flight_stops_a_deploy_that_changes_what_it_runs_on(stubbed):
    machine = "arn:aws:states:us-east-1:123456789012:stateMachine:pipeline"
    running = {
        "executions": [
            {
                "executionArn": f"{machine}:run-7",
                "stateMachineArn": machine,
                "name": "run-7",
                "status": "RUNNING",
                "startDate": "2026-11-26T08:00:00Z",
            }
        ]
    }
    cfn, sfn = stubbed("cloudformation"), stubbed("stepfunctions")
    cfn.add_response("describe_stacks", _stack("EfaTraining-dev-Pipeline", {"StateMachineArn": machine}))
    sfn.add_response("list_executions", running, {"stateMachineArn": machine, "statusFilter": "RUNNING"})
    # The override as a make user types it too (the Makefile's ALLOW_RUNNING=1), not only the tool's flag.
    refusal = r"run-7 is running .* changes EfaTraining-dev-Batch under it \(docs/operators-guide.md, 'Day two'\): "
    with pytest.raises(preflight.PreflightError, match=refusal + r"wait .* --allow-running \(make: ALLOW_RUNNING=1\)$"):
        preflight.check_no_run_in_flight(REGION, "EfaTraining-dev-Pipeline", ["EfaTraining-dev-Batch"], "deploy")
    # Nothing that a run stands on changes: no AWS call at all (the stubs have no answer left to give).
    preflight.check_no_run_in_flight(REGION, "EfaTraining-dev-Pipeline", [], "deploy")


def test_a_job_submitted_by_hand_holds_a_batch_deploy_back_like_a_run(stubbed, monkeypatch):
    # A compute environment's infrastructure update or a deleted queue cuts short what runs in it (Batch user guide,
    # "Updating compute environments"; Batch API reference, DeleteJobQueue): a job of the research share counts too.
    monkeypatch.setattr(preflight, "running_executions", lambda region, stack: [])
    batch = stubbed("batch")
    for status in preflight.UNFINISHED_JOB_STATES:
        jobs = [{"jobId": "1", "jobName": "by-hand"}] if status == "RUNNING" else []
        batch.add_response(
            "list_jobs", {"jobSummaryList": jobs}, {"jobQueue": "efa-training-dev-multi-node", "jobStatus": status}
        )
    for _queue in ("single-node", "single-node-on-demand"):  # not deployed: no queue, no job
        batch.add_client_error("list_jobs", "ClientException", "JobQueue does not exist")
    refusal = r"Batch job by-hand has not ended .* EfaTraining-dev-Batch under it \(docs/operators-guide.md, 'Day two'"
    with pytest.raises(preflight.PreflightError, match=refusal + r"\).* --allow-running \(make: ALLOW_RUNNING=1\)$"):
        preflight.check_no_run_in_flight(REGION, "EfaTraining-dev-Pipeline", ["EfaTraining-dev-Batch"], "deploy", "dev")


def test_a_deploy_checks_the_assembly_it_synthesized_unless_told_a_run_may_go_on(monkeypatch, tmp_path):
    asked: list[list[str]] = []
    monkeypatch.setattr(deploy, "ASSEMBLY", tmp_path)

    def changed(region: str, assembly: object, names: list[str]) -> list[str]:
        asked.append(names)
        return []

    monkeypatch.setattr(preflight, "changed_stacks", changed)
    monkeypatch.setattr(preflight, "check_no_run_in_flight", lambda *a: None)
    config = deploy._config("prod", None, [])
    deploy._check_assembly(config, "123456789012", None, deploy.Options())
    assert asked == [[f"EfaTraining-prod-{unit}" for unit in deploy.RUN_UNITS]]
    deploy._check_assembly(config, "123456789012", None, deploy.Options(allow_running=True))
    assert len(asked) == 1


@pytest.fixture
def destroying(monkeypatch):
    monkeypatch.setattr(destroy, "caller_account", lambda region: "123456789012")
    monkeypatch.setattr(preflight.shutil, "which", lambda name: None)  # no Docker: destroying builds nothing
    refused: list[str] = []
    monkeypatch.setattr(
        preflight, "check_no_run_in_flight", lambda region, pipeline, changing, verb, batch=None: refused.append(verb)
    )
    return refused


def test_destroying_dev_removes_every_stack(destroying):
    # Not a dry run: a dry run asks AWS nothing (tests/test_dry_run.py), so it makes no in-flight check.
    (command,) = destroy.plan("dev", dry_run=False, run=lambda *a: 0)
    assert command[1:] == ["destroy", "--all", "--force", "-c", "env=dev"] and destroying == ["destroy"]


def test_destroying_prod_keeps_the_network_under_its_kept_file_system_and_says_so(destroying, capsys):
    # retain_data keeps the file system, whose interfaces stay in the training subnet: Network cannot go yet.
    (command,) = destroy.plan("prod", dry_run=False, run=lambda *a: 0)
    assert command[-3:] == ["EfaTraining-prod-Storage", "EfaTraining-prod-Registry", "EfaTraining-prod-Alerts"]
    assert "--all" not in command
    out = capsys.readouterr().out
    assert "kept (retain_data)" in out and "aws fsx delete-file-system" in out and "EfaTraining-prod-Network" in out


def test_unconfirmed_alert_emails_are_named_after_a_deploy(stubbed):
    # SNS deletes an unconfirmed subscription after 48 hours and sends it nothing until then.
    topic = "arn:aws:sns:us-east-1:123456789012:alerts"
    cfn, sns = stubbed("cloudformation"), stubbed("sns")
    cfn.add_response("describe_stacks", _stack("EfaTraining-dev-Alerts", {"AlertsTopicArn": topic}))
    subscriptions = [
        {"SubscriptionArn": "PendingConfirmation", "Endpoint": "oncall@example.com", "Protocol": "email"},
        {"SubscriptionArn": f"{topic}:1", "Endpoint": "ml-platform-dev@example.com", "Protocol": "email"},
    ]
    sns.add_response("list_subscriptions_by_topic", {"Subscriptions": subscriptions}, {"TopicArn": topic})
    (line,) = preflight.unconfirmed_subscriptions(REGION, "EfaTraining-dev-Alerts")
    assert line.startswith("1 alert e-mail(s) not confirmed yet (oncall@example.com)") and "48 hours" in line
    # a redeploy leaves the subscription as it is: the line says what does send the link again
    assert f"aws sns subscribe --region {REGION} --topic-arn {topic} --protocol email" in line


def test_a_topic_without_a_confirmed_subscription_is_said_to_reach_nobody(stubbed):
    # Zero subscriptions, or only pending ones: every alarm publishes to a topic nobody reads.
    topic = "arn:aws:sns:us-east-1:123456789012:alerts"
    cfn, sns = stubbed("cloudformation"), stubbed("sns")
    cfn.add_response("describe_stacks", _stack("EfaTraining-dev-Alerts", {"AlertsTopicArn": topic}))
    sns.add_response("list_subscriptions_by_topic", {"Subscriptions": []}, {"TopicArn": topic})
    (line,) = preflight.unconfirmed_subscriptions(REGION, "EfaTraining-dev-Alerts")
    assert line.startswith(f"no confirmed subscription on {topic} (0 in all)") and "reaches nobody" in line


def test_placeholder_alert_emails_are_flagged():
    # RFC 2606 reserves example.com for documentation; cdk.json ships such addresses until someone sets real ones.
    (line,) = preflight.placeholder_emails(("ml-platform@example.com", "oncall@corp.test", "finops@Example.org"))
    assert "ml-platform@example.com" in line and "finops@Example.org" in line and "corp.test" not in line
    assert preflight.placeholder_emails(("oncall@corp.test",)) == []


def test_the_dry_run_plan_flags_the_shipped_placeholder_alert_emails():
    from tools import deploy_plan

    config = deploy._config("prod", None, [])
    assert config.alert_emails and all(e.endswith("@example.com") for e in config.alert_emails)
    request = deploy_plan.Request("prod", config, allow_running=True, run_units=deploy.RUN_UNITS)
    (warning,) = [line for line in deploy_plan._check_lines(request, [], 6) if line.startswith("warning:")]
    assert warning.startswith("warning: alert_emails finops@example.com, ml-platform@example.com: a documentation")


def test_destroying_takes_the_context_the_environment_was_deployed_with(destroying):
    # An environment deployed with -c compute=eks is synthesized the same way to be destroyed, or its Eks stack (and
    # the exports it imports) would be left behind.
    (command,) = destroy.plan("dev", dry_run=True, run=lambda *a: 0, extra=["-c", "compute=eks"])
    assert command[-2:] == ["-c", "compute=eks"]


def test_the_environment_is_named_once():
    # The checks follow the environment argument; a second one among the cdk arguments would split them.
    with pytest.raises(deploy.DeployError, match="name the environment once"):
        deploy._split_context(["-c", "env=prod"])
    assert deploy._split_context(["--context=nodes=4", "--progress", "events"]) == (
        ["-c", "nodes=4"],
        ["--progress", "events"],
    )


# ---- the instance type's offering (EC2 API reference, DescribeInstanceTypeOfferings)


def _offerings(*zones: str) -> dict:
    return {
        "InstanceTypeOfferings": [
            {"InstanceType": "p5.48xlarge", "LocationType": "availability-zone", "Location": z} for z in zones
        ]
    }


def test_a_type_ec2_does_not_offer_in_the_region_is_refused(stubbed):
    stubbed("ec2").add_response("describe_instance_type_offerings", _offerings())
    with pytest.raises(preflight.PreflightError, match="EC2 does not offer p5.48xlarge in us-east-1"):
        preflight.check_instance_offered(REGION, "p5.48xlarge", None)


def test_a_zone_that_does_not_offer_the_type_is_refused_naming_those_that_do(stubbed):
    stubbed("ec2").add_response("describe_instance_type_offerings", _offerings("us-east-1b", "us-east-1d"))
    with pytest.raises(preflight.PreflightError, match="only in us-east-1b, us-east-1d, not in us-east-1a"):
        preflight.check_instance_offered(REGION, "p5.48xlarge", "us-east-1a")


def test_a_zone_that_offers_the_type_passes(stubbed):
    stubbed("ec2").add_response("describe_instance_type_offerings", _offerings("us-east-1a"))
    preflight.check_instance_offered(REGION, "p5.48xlarge", "us-east-1a")


def test_the_offering_is_checked_for_the_training_and_validation_types_on_batch_and_eks_only():
    from config import load_config
    from tests.synthesis import CAPACITY_BLOCK, CDK_JSON_CONTEXT

    def checked(**context: str) -> tuple[list[str], list[str]]:
        config = load_config({**CDK_JSON_CONTEXT, **context})
        return preflight.offering_checked(config), [config.instance.name, config.single_node_instance.name]

    found, types = checked(instance_type="p5.48xlarge")
    assert found == types and types[0] != types[1]  # the training type and its single-node validation type
    assert checked(compute="sagemaker", instance_type="p5.48xlarge")[0] == []  # SageMaker's capacity, not EC2's
    found, types = checked(compute="eks", instance_type="p5e.48xlarge", **CAPACITY_BLOCK)
    assert "p5e.48xlarge" not in found and found == types[1:]  # a Capacity Block's capacity is the block's


# ---- the reserved capacity, against EC2's and SageMaker's record of it (make deploy) ---------------------------


def _reserved_config(compute: str = "batch", **reservation):
    from config import load_config
    from tests.synthesis import CDK_JSON_CONTEXT

    declared = {"kind": "capacity_block", "id": "cr-0123456789abcdef0", "zone": "us-east-1a", "instances": 2}
    context = {**CDK_JSON_CONTEXT, "compute": compute, "instance_type": "p5.48xlarge"}
    if compute != "sagemaker":
        context["availability_zone"] = "us-east-1a"
    return load_config({**context, "capacity_reservation": json.dumps({**declared, **reservation})})


def _ec2_reservation(**changes) -> dict:
    found = {"CapacityReservationId": "cr-0123456789abcdef0", "InstanceType": "p5.48xlarge",
             "AvailabilityZone": "us-east-1a", "TotalInstanceCount": 2, "State": "scheduled",
             "ReservationType": "capacity-block"}  # fmt: skip
    return {"CapacityReservations": [{**found, **changes}]}


def test_a_capacity_block_that_holds_the_run_passes(stubbed):
    # Scheduled: bought for a window that has not begun; the jobs wait for it (docs/users-guide.md, Reserved capacity).
    stubbed("ec2").add_response("describe_capacity_reservations", _ec2_reservation())
    preflight.check_reservation(_reserved_config())


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"InstanceType": "p4d.24xlarge"}, "type p4d.24xlarge, not p5.48xlarge"),
        ({"AvailabilityZone": "us-east-1b"}, "zone us-east-1b, not us-east-1a"),
        ({"TotalInstanceCount": 1}, "1 instances, fewer than nodes (2)"),
        ({"State": "expired"}, "state expired"),
        ({"ReservationType": "default"}, "an On-Demand reservation, declared capacity_block"),
    ],
)
def test_a_reservation_that_cannot_take_the_run_stops_the_deploy_naming_why(stubbed, changes, named):
    stubbed("ec2").add_response("describe_capacity_reservations", _ec2_reservation(**changes))
    with pytest.raises(
        preflight.PreflightError, match=f"capacity_reservation cr-0123456789abcdef0 .*{re.escape(named)}"
    ):
        preflight.check_reservation(_reserved_config())


def test_a_reservation_ec2_does_not_know_stops_the_deploy(stubbed):
    stubbed("ec2").add_client_error("describe_capacity_reservations", "InvalidCapacityReservationId.NotFound")
    with pytest.raises(preflight.PreflightError, match="capacity_reservation.id=cr-0123456789abcdef0: EC2 does not"):
        preflight.check_reservation(_reserved_config())


def _plan(**changes) -> dict:
    plan = {"TrainingPlanArn": PLAN, "TrainingPlanName": "p5-week", "Status": "Scheduled", "TotalInstanceCount": 2,
            "TargetResources": ["training-job"],
            "ReservedCapacitySummaries": [{"ReservedCapacityArn": PLAN + "/rc", "InstanceType": "ml.p5.48xlarge",
                                           "TotalInstanceCount": 2, "Status": "Scheduled"}]}  # fmt: skip
    return {**plan, **changes}


PLAN = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p5-week"


def test_a_training_plan_is_checked_for_its_status_target_type_and_count(stubbed):
    sagemaker = stubbed("sagemaker")
    config = _reserved_config("sagemaker", kind="training_plan", id=None, zone=None, training_plan=PLAN)
    sagemaker.add_response("describe_training_plan", _plan(), {"TrainingPlanName": "p5-week"})
    preflight.check_reservation(config)
    sagemaker.add_response("describe_training_plan", _plan(Status="Expired", TargetResources=["hyperpod-cluster"]))
    with pytest.raises(preflight.PreflightError, match="training plan p5-week .*status Expired; no training-job"):
        preflight.check_reservation(config)

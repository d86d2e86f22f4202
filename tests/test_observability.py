"""Observability stack: dashboard widgets per backend and accelerator, alarms to the alerts topic, the budget."""

import json

import aws_cdk as cdk
import aws_cdk.aws_sns as sns
import aws_cdk.aws_stepfunctions as sfn
import pytest
from aws_cdk.assertions import Match, Template

from config import CATALOGUE, Accelerator, load_config
from constructs.observability.accelerator_metrics import accelerator_metrics
from constructs.observability.job_state_metrics import METRIC_NAME as JOB_STATE_METRIC, JobStateMetrics
from constructs.observability.alarms import GIB, TrainingAlarms
from constructs.observability.dashboard import TRAINING_METRICS, TrainingDashboard
from tests.conftest import CDK_JSON_CONTEXT

NVIDIA = next(name for name, it in CATALOGUE.items() if it.accelerator is Accelerator.NVIDIA and it.has_efa)
NEURON = next(name for name, it in CATALOGUE.items() if it.accelerator is Accelerator.NEURON and it.has_efa)
EXPECTED_ACCELERATOR_METRICS = {
    ("batch", NVIDIA): ["nvidia_smi_utilization_gpu", "nvidia_smi_memory_used", "efa_rx_bytes", "efa_tx_bytes"],
    ("batch", NEURON): ["neuroncore_utilization", "efa_rx_bytes", "efa_tx_bytes"],
    ("eks", NVIDIA): ["node_gpu_utilization", "node_gpu_memory_utilization", "node_efa_rx_bytes", "node_efa_tx_bytes"],
    ("eks", NEURON): ["node_neuroncore_utilization", "node_efa_rx_bytes", "node_efa_tx_bytes"],
}


def _body(template: Template) -> str:
    """The dashboard body with its CloudFormation joins flattened into one searchable string."""
    (dashboard,) = template.find_resources("AWS::CloudWatch::Dashboard").values()
    return json.dumps(dashboard["Properties"]["DashboardBody"])


def _alarms(template: Template) -> dict[str, dict]:
    return {res["Properties"]["AlarmName"]: res["Properties"]
            for res in template.find_resources("AWS::CloudWatch::Alarm").values()}


@pytest.mark.parametrize("env", list(CDK_JSON_CONTEXT["environments"]))
@pytest.mark.parametrize("compute", ["batch", "eks"])
def test_every_environment_and_backend_has_dashboard_alarms_and_budget(synth, env, compute):
    # Acceptance: each shipped environment on each backend synthesizes the three parts of issue #7.
    template = synth(env=env, compute=compute).template("observability")
    template.resource_count_is("AWS::CloudWatch::Dashboard", 1)
    template.resource_count_is("AWS::Budgets::Budget", 1)
    assert len(template.find_resources("AWS::CloudWatch::Alarm")) >= 3


@pytest.mark.parametrize(("compute", "instance_type"), list(EXPECTED_ACCELERATOR_METRICS))
def test_dashboard_graphs_the_backends_accelerator_and_efa_metrics(synth, compute, instance_type):
    # GPU/NeuronCore utilisation, memory and EFA bytes come from the metric source of the selected backend.
    body = _body(synth(compute=compute, instance_type=instance_type).template("observability"))
    for metric in EXPECTED_ACCELERATOR_METRICS[(compute, instance_type)]:
        assert f'MetricName=\\\\\\"{metric}\\\\\\"' in body, metric


@pytest.mark.parametrize("compute", ["batch", "eks"])
def test_dashboard_never_graphs_the_other_accelerators_metrics(synth, compute):
    # A Neuron environment shows no nvidia/GPU series (and vice versa), so no widget stays empty by design.
    body = _body(synth(compute=compute, instance_type=NEURON).template("observability"))
    assert "nvidia_smi" not in body and "node_gpu_" not in body


def test_dashboard_searches_every_training_metric_over_run_ids(synth):
    # Run ids are dynamic: each EMF metric is a SEARCH over the RunId dimension of namespace EfaTraining,
    # limited to this environment's runs (the Environment dimension every job of the environment sets).
    body = _body(synth().template("observability"))
    for metric in TRAINING_METRICS:
        assert (f"SEARCH('{{EfaTraining,Environment,RunId}} Environment=\\\\\\\"dev\\\\\\\" "
                f"MetricName=\\\\\\\"{metric}\\\\\\\"'") in body, metric


def test_dashboard_graphs_fsx_throughput_and_free_capacity(synth):
    # FSx read/write bytes become bytes per second; free capacity is graphed at its minimum.
    body = _body(synth().template("observability"))
    for fragment in ("DataReadBytes", "DataWriteBytes", "FreeDataStorageCapacity", "r/PERIOD(r)", "w/PERIOD(w)"):
        assert fragment in body, fragment


def test_alarms_publish_to_the_alerts_topic(synth):
    # Every alarm's action is the environment's alerts topic (a reference into the Alerts stack).
    alarms = _alarms(synth().template("observability"))
    for name, props in alarms.items():
        assert "EfaTraining-dev-Alerts" in json.dumps(props["AlarmActions"]), name


def test_idle_accelerator_alarm_uses_config_threshold_and_duration(synth):
    # Below gpu_idle_threshold_percent for gpu_idle_minutes (5-minute periods) raises the alarm.
    alarm = _alarms(synth(gpu_idle_threshold_percent="15", gpu_idle_minutes="45").template("observability"))[
        "EfaTraining-dev-accelerators-idle"]
    assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (15, "LessThanThreshold")
    assert alarm["EvaluationPeriods"] == alarm["DatapointsToAlarm"] == 45 // 5


def test_idle_alarm_on_batch_watches_each_host_of_this_environment(synth):
    # One contributor per host (GROUP BY host), only this environment's series (the agent's Environment
    # dimension): one idle node among busy ones raises it (CloudWatch multi-time-series Metrics Insights alarms).
    alarm = _alarms(synth().template("observability"))["EfaTraining-dev-accelerators-idle"]
    assert alarm["Metrics"][0]["Expression"] == (
        "SELECT AVG(nvidia_smi_utilization_gpu) FROM CWAgent WHERE Environment = 'dev' "
        "GROUP BY host ORDER BY AVG() ASC")


def test_idle_alarm_on_eks_watches_each_node_of_the_cluster():
    # On EKS: Container Insights' node_gpu_utilization (ClusterName, InstanceId, NodeName) per node of this cluster.
    stack = cdk.Stack()
    TrainingAlarms(stack, "Alarms", topic=sns.Topic(stack, "T"), alarm_prefix="p",
                   accelerators=accelerator_metrics("eks", Accelerator.NVIDIA, environment="dev",
                                                    cluster_name="training"),
                   file_system_id="fs-1", fsx_storage_gib=1200, fsx_free_percent=10,
                   idle_threshold_percent=20, idle_minutes=30, environment="dev")
    Template.from_stack(stack).has_resource_properties("AWS::CloudWatch::Alarm", {"Metrics": [Match.object_like({
        "Expression": "SELECT AVG(node_gpu_utilization) FROM SCHEMA(ContainerInsights, ClusterName, InstanceId, "
                      "NodeName) WHERE ClusterName = 'training' GROUP BY NodeName ORDER BY AVG() ASC"})]})


def test_idle_alarm_on_batch_neuron_reads_the_environments_own_namespace():
    # neuron-monitor's publisher takes no extra dimension: the namespace itself names the environment.
    m = accelerator_metrics("batch", Accelerator.NEURON, environment="prod")
    assert m.insights_lowest_node(m.utilization) == (
        "SELECT AVG(neuroncore_utilization) FROM EfaTraining/prod/Neuron GROUP BY InstanceId ORDER BY AVG() ASC")


def test_non_finite_loss_alarm_fires_on_any_run(synth):
    # One NonFiniteLoss >= 1 in any RunId of this environment within a minute raises the alarm; other
    # environments' runs (same namespace, another Environment value) never do.
    alarm = _alarms(synth().template("observability"))["EfaTraining-dev-non-finite-loss"]
    assert alarm["Metrics"][0]["Expression"] == ("SELECT MAX(NonFiniteLoss) FROM SCHEMA(EfaTraining, Environment, RunId) "
                                                 "WHERE Environment = 'dev'")
    assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (1, "GreaterThanOrEqualToThreshold")


@pytest.mark.parametrize("env", list(CDK_JSON_CONTEXT["environments"]))
def test_fsx_alarm_threshold_is_the_configured_share_of_capacity(synth, env):
    # Free capacity below fsx_free_capacity_alarm_percent of fsx_storage_gib (in bytes) raises the alarm.
    config = load_config({**CDK_JSON_CONTEXT, "env": env})
    alarm = _alarms(synth(env=env).template("observability"))[f"EfaTraining-{env}-fsx-free-capacity-low"]
    assert alarm["MetricName"] == "FreeDataStorageCapacity"
    assert alarm["Threshold"] == pytest.approx(config.fsx_storage_gib * GIB * config.fsx_free_capacity_alarm_percent / 100)
    assert alarm["ComparisonOperator"] == "LessThanThreshold"


def test_fsx_alarm_compares_the_whole_file_systems_free_bytes(synth):
    # FSx for Lustre user guide (fs-metrics.html): FreeDataStorageCapacity's Sum is the file system's free bytes,
    # its Minimum only the fullest storage target's; one-minute periods hold one sample per target.
    alarm = _alarms(synth(env="prod").template("observability"))["EfaTraining-prod-fsx-free-capacity-low"]
    assert (alarm["Statistic"], alarm["Period"]) == ("Sum", 60)


def _pipeline_template() -> Template:
    stack = cdk.Stack()
    machine = sfn.StateMachine(stack, "Machine", definition_body=sfn.DefinitionBody.from_chainable(sfn.Pass(stack, "P")))
    log_group = cdk.aws_logs.LogGroup(stack, "ExecutionLogs")
    accelerators = accelerator_metrics("batch", Accelerator.NVIDIA, environment="dev")
    alarms = TrainingAlarms(stack, "Alarms", topic=sns.Topic(stack, "T"), alarm_prefix="p", accelerators=accelerators,
                            file_system_id="fs-1", fsx_storage_gib=1200, fsx_free_percent=10,
                            idle_threshold_percent=20, idle_minutes=30, state_machine=machine,
                            execution_log_group=log_group, pipeline_namespace="EfaTraining/dev/Pipeline",
                            environment="dev")
    TrainingDashboard(stack, "Dashboard", dashboard_name="d", accelerators=accelerators, file_system_id="fs-1",
                      state_machine=machine, pipeline_outcomes=alarms.pipeline_metrics)
    return Template.from_stack(stack)


def test_pipeline_widgets_graph_every_execution_outcome():
    # Started, succeeded, broken, rejected, timed out, aborted, and execution time.
    body = _body(_pipeline_template())
    for metric in ("ExecutionsStarted", "ExecutionsSucceeded", "PipelineFailures", "ModelsRejected",
                   "ExecutionsTimedOut", "ExecutionsAborted", "ExecutionTime"):
        assert metric in body, metric


def test_broken_pipeline_alarm_adds_failures_timeouts_and_aborts():
    # failed (other than a rejected model) + timed out + aborted >= 1 in 5 minutes pages the topic.
    (alarm,) = [a for a in _pipeline_template().find_resources("AWS::CloudWatch::Alarm").values()
                if a["Properties"]["AlarmName"] == "p-pipeline-broken"]
    metrics = {m["Id"]: m for m in alarm["Properties"]["Metrics"]}
    assert metrics["expr_1"]["Expression"] == "FILL(failed, 0) + FILL(timedOut, 0) + FILL(aborted, 0)"
    assert metrics["failed"]["MetricStat"]["Metric"]["MetricName"] == "PipelineFailures"
    assert [metrics[k]["MetricStat"]["Metric"]["MetricName"] for k in ("timedOut", "aborted")] == [
        "ExecutionsTimedOut", "ExecutionsAborted"]
    assert (alarm["Properties"]["Threshold"], alarm["Properties"]["ComparisonOperator"]) == (
        1, "GreaterThanOrEqualToThreshold")


@pytest.mark.parametrize(("metric", "pattern"), [
    # A refused input (InvalidInput: malformed, or a run id already taken) ran nothing: it is not a broken pipeline.
    ("PipelineFailures", '{ ($.type = "ExecutionFailed") && ($.details.error != "ValidationFailed") && '
                         '($.details.error != "InvalidInput") }'),
    ("ModelsRejected", '{ ($.type = "ExecutionFailed") && ($.details.error = "ValidationFailed") }'),
])
def test_execution_log_filters_split_failures_from_rejected_models(metric, pattern):
    # Step Functions' ExecutionFailed log event names the error: a rejected model is counted apart, never paged.
    _pipeline_template().has_resource_properties("AWS::Logs::MetricFilter", {
        "FilterPattern": pattern, "MetricTransformations": [Match.object_like({
            "MetricName": metric, "MetricNamespace": "EfaTraining/dev/Pipeline", "MetricValue": "1"})]})


def test_rejection_error_is_the_pipelines_validation_failed_state(synth):
    # The filter's error name is the one the pipeline's Fail state for a rejected model raises.
    from constructs.observability.alarms import MODEL_REJECTED_ERROR
    (machine,) = synth().template("pipeline").find_resources("AWS::StepFunctions::StateMachine").values()
    assert f'\\"Error\\":\\"{MODEL_REJECTED_ERROR}\\"' in json.dumps(machine["Properties"]["DefinitionString"])


def test_job_state_metrics_count_batch_state_changes_by_status():
    # Batch job state changes of our queues reach a log group whose metric filter counts them per Status.
    stack = cdk.Stack()
    JobStateMetrics(stack, "Jobs", job_queue_arns=["arn:aws:batch:us-east-1:111111111111:job-queue/q"],
                    namespace="EfaTraining/dev/Batch", retention=cdk.aws_logs.RetentionDays.ONE_WEEK,
                    removal_policy=cdk.RemovalPolicy.DESTROY)
    template = Template.from_stack(stack)
    template.has_resource_properties("AWS::Events::Rule", {"EventPattern": {
        "source": ["aws.batch"], "detail-type": ["Batch Job State Change"],
        "detail": {"jobQueue": ["arn:aws:batch:us-east-1:111111111111:job-queue/q"]}}})
    template.has_resource_properties("AWS::Logs::MetricFilter", {"MetricTransformations": [Match.object_like({
        "MetricName": JOB_STATE_METRIC, "MetricNamespace": "EfaTraining/dev/Batch",
        "Dimensions": Match.array_with([{"Key": "Status", "Value": "$.detail.status"}])})]})
    template.resource_count_is("AWS::Logs::ResourcePolicy", 1)
    template.resource_count_is("AWS::Lambda::Function", 0)


def test_budget_is_monthly_cost_filtered_to_the_environment_tag(synth):
    # The budget counts only costs tagged Environment=<env> (user-defined cost-allocation tag), per month.
    template = synth(env="prod").template("observability")
    template.has_resource_properties("AWS::Budgets::Budget", {"Budget": Match.object_like({
        "BudgetType": "COST", "TimeUnit": "MONTHLY",
        "BudgetLimit": {"Amount": CDK_JSON_CONTEXT["environments"]["prod"]["budget_monthly_usd"], "Unit": "USD"},
        "CostFilters": {"TagKeyValue": ["user:Environment$prod"]}})})


def test_budget_notifies_topic_on_actual_80_and_forecast_100(synth):
    # Two notifications, ACTUAL > 80 % and FORECASTED > 100 %, both to the alerts SNS topic.
    (budget,) = synth().template("observability").find_resources("AWS::Budgets::Budget").values()
    notifications = budget["Properties"]["NotificationsWithSubscribers"]
    kinds = {(n["Notification"]["NotificationType"], n["Notification"]["Threshold"]) for n in notifications}
    assert kinds == {("ACTUAL", 80), ("FORECASTED", 100)}
    for n in notifications:
        assert n["Notification"]["ThresholdType"] == "PERCENTAGE"
        assert [s["SubscriptionType"] for s in n["Subscribers"]] == ["SNS"]
        assert "EfaTraining-dev-Alerts" in json.dumps(n["Subscribers"][0]["Address"])


def test_eks_dashboard_is_scoped_to_the_environments_cluster(synth):
    # On EKS every Container Insights SEARCH names this environment's cluster, so two clusters never mix.
    body = _body(synth(compute="eks").template("observability"))
    assert body.count("ClusterName=") >= len(EXPECTED_ACCELERATOR_METRICS[("eks", NVIDIA)])


def test_job_states_are_counted_for_the_batch_stacks_queues(synth):
    # The seam (ComputeBackend.job_queue_arns): the job-state rule listens to the Batch stack's own queues.
    synthesized = synth()
    (rule,) = synthesized.template("observability").find_resources("AWS::Events::Rule").values()
    queues = [q["Fn::GetStackOutput"] for q in rule["Properties"]["EventPattern"]["detail"]["jobQueue"]]
    assert {q["StackName"] for q in queues} == {synthesized.stacks["compute"].stack_name}
    assert [q["OutputName"].split("FnGetAtt")[1].split("Queue")[0] for q in queues] == ["MultiNode", "SingleNode"]


def _topic_statements(synth) -> list[dict]:
    (policy,) = synth().template("alerts").find_resources("AWS::SNS::TopicPolicy").values()
    return policy["Properties"]["PolicyDocument"]["Statement"]


@pytest.mark.parametrize(("service", "source_arn"), [
    # CloudWatch user guide (Notify_Users_Alarm_Changes.html): alarms publish as cloudwatch.amazonaws.com.
    ("cloudwatch.amazonaws.com", ["arn:aws:cloudwatch:us-east-1:", {"Ref": "AWS::AccountId"}, ":alarm:*"]),
    # AWS Budgets user guide (budgets-sns-policy.html): budgets publish as budgets.amazonaws.com.
    ("budgets.amazonaws.com", ["arn:aws:budgets::", {"Ref": "AWS::AccountId"}, ":*"]),
])
def test_alerts_topic_lets_this_accounts_alarms_and_budgets_publish(synth, service, source_arn):
    # The topic policy replaces SNS's default: each publishing service has its own statement, scoped to this
    # account (aws:SourceAccount) and to its own kind of source (aws:SourceArn), or notifications are denied.
    (statement,) = [s for s in _topic_statements(synth) if s.get("Principal") == {"Service": service}]
    assert statement["Effect"] == "Allow" and statement["Action"] == "sns:Publish"
    assert statement["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    assert statement["Condition"]["ArnLike"] == {"aws:SourceArn": {"Fn::Join": ["", source_arn]}}


def test_alerts_topic_grants_no_other_publisher(synth):
    # Only CloudWatch and Budgets get statements; the pipeline publishes with its own role, nothing else may.
    principals = [s["Principal"] for s in _topic_statements(synth) if s["Effect"] == "Allow"]
    assert sorted(p["Service"] for p in principals) == ["budgets.amazonaws.com", "cloudwatch.amazonaws.com"]


def test_alerts_key_lets_the_publishing_services_use_it(synth):
    # An encrypted topic: CloudWatch and Budgets need kms:Decrypt and kms:GenerateDataKey* on its key.
    (key,) = synth().template("alerts").find_resources("AWS::KMS::Key").values()
    statements = key["Properties"]["KeyPolicy"]["Statement"]
    granted = {service for s in statements if {"kms:Decrypt", "kms:GenerateDataKey*"} <= set(s["Action"])
               for service in s["Principal"].get("Service", [])}
    assert {"cloudwatch.amazonaws.com", "budgets.amazonaws.com"} <= granted


def test_eks_observability_addon_runs_the_agents_emf_listener(synth):
    # The add-on's agent config keeps enhanced Container Insights and adds logs.metrics_collected.emf (TCP/UDP
    # 25888): the training pods' EMF lines go there, since Fluent Bit's wrapped stdout lines are not extracted.
    (addon,) = [a for a in synth(compute="eks").template("compute").find_resources("AWS::EKS::Addon").values()
                if a["Properties"]["AddonName"] == "amazon-cloudwatch-observability"]
    collected = json.loads(addon["Properties"]["ConfigurationValues"])["agent"]["config"]["logs"]["metrics_collected"]
    assert collected["emf"] == {} and collected["kubernetes"]["enhanced_container_insights"] is True


def test_eks_training_pods_send_metrics_to_the_node_agent():
    # Every training container names the agent's node-local Service on the EMF port and the metrics log group.
    import contracts.eks.job_spec as spec
    pod = spec.pod_spec(CATALOGUE[NVIDIA], image="i", phase="train", nodes=2)
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env["AWS_EMF_AGENT_ENDPOINT"] == "tcp://cloudwatch-agent.amazon-cloudwatch:25888"
    assert env["AWS_EMF_LOG_GROUP_NAME"] == spec.EMF_LOG_GROUP

"""The exact event that reaches CloudWatch Logs on each backend, checked against the EMF specification.

CloudWatch user guide, CloudWatch_Embedded_Metric_Format_Specification.html: the log event message is one JSON
object (nothing before or after it) whose root holds `_aws` {Timestamp (ms number), CloudWatchMetrics: [{Namespace,
Dimensions: [[names]], Metrics: [{Name, Unit?}]}]}; every referenced dimension is a string member of the root and
every referenced metric a number (or array of numbers) member of the root.
"""

import io
import json
import math
import socket
import threading

import pytest

from efa_training.runtime import metrics

UNITS = {
    "Seconds",
    "Microseconds",
    "Milliseconds",
    "Bytes",
    "Kilobytes",
    "Megabytes",
    "Gigabytes",
    "Terabytes",
    "Bits",
    "Kilobits",
    "Megabits",
    "Gigabits",
    "Terabits",
    "Percent",
    "Count",
    "Bytes/Second",
    "Kilobytes/Second",
    "Megabytes/Second",
    "Gigabytes/Second",
    "Terabytes/Second",
    "Bits/Second",
    "Kilobits/Second",
    "Megabits/Second",
    "Gigabits/Second",
    "Terabits/Second",
    "Count/Second",
    "None",
}


def emf_problems(message: str) -> list[str]:
    """What makes `message` (one log event) not an EMF document; empty when CloudWatch would extract it."""
    try:
        root = json.loads(message, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except ValueError as error:
        return [f"not a JSON object: {error}"]
    if not isinstance(root, dict) or not isinstance(root.get("_aws"), dict):
        return ["no _aws object at the root"]
    meta, problems = root["_aws"], []
    if not isinstance(meta.get("Timestamp"), int):
        problems.append("_aws.Timestamp is not a number of milliseconds")
    directives = meta.get("CloudWatchMetrics")
    if not isinstance(directives, list) or not directives:
        return problems + ["_aws.CloudWatchMetrics is not a non-empty array"]
    for d in directives:
        if not isinstance(d.get("Namespace"), str) or not d["Namespace"]:
            problems.append("a directive has no Namespace")
        for dimension_set in d.get("Dimensions", []):
            problems += [
                f"dimension {n} is not a string member" for n in dimension_set if not isinstance(root.get(n), str)
            ]
        for m in d.get("Metrics", []):
            value = root.get(m.get("Name"))
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)):
                problems.append(f"metric {m.get('Name')} has no numeric member")
            if "Unit" in m and m["Unit"] not in UNITS:
                problems.append(f"metric {m['Name']} has unit {m['Unit']}")
    return problems


def _stdout_line(**step) -> str:
    stream = io.StringIO()
    metrics.MetricsLogger("run-1", enabled=True, stream=stream, environ={}).step(**step)
    (line,) = stream.getvalue().splitlines()
    return line


def test_batch_event_is_the_stdout_line_and_a_valid_emf_document():
    # Batch: the awslogs driver sends each stdout line as one PutLogEvents message, the EMF document at its root.
    line = _stdout_line(step=3, loss=2.5, tokens_per_s=1000.0, step_time_s=0.4, mfu_percent=41.0)
    assert emf_problems(line) == []
    names = {m["Name"] for m in json.loads(line)["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert names == {"Loss", "TokensPerSecond", "StepTimeSeconds", "MFU", "NonFiniteLoss", "ProgressLines"}


def test_fluent_bit_wrapped_line_is_not_emf():
    # Why EKS needs the agent: the add-on's Fluent Bit wraps the line, and `_aws` is no longer at the root.
    line = _stdout_line(step=3, loss=2.5, tokens_per_s=1000.0, step_time_s=0.4)
    wrapped = json.dumps({"log": line, "log_processed": json.loads(line), "kubernetes": {"pod_name": "p"}})
    assert emf_problems(wrapped) == ["no _aws object at the root"]


@pytest.mark.parametrize(
    ("loss", "tokens"), [(float("nan"), 1000.0), (2.5, float("inf")), (float("-inf"), float("nan"))]
)
def test_non_finite_values_never_make_a_line_invalid(loss, tokens):
    # NaN/Infinity are not JSON: such a value is left out and the rest of the line still becomes metrics.
    line = _stdout_line(step=9, loss=loss, tokens_per_s=tokens, step_time_s=0.4)
    assert emf_problems(line) == []
    record = json.loads(line)
    assert record["NonFiniteLoss"] == (0 if math.isfinite(loss) else 1) and record["StepTimeSeconds"] == 0.4


class _Agent:
    """A TCP listener standing in for the CloudWatch agent's EMF endpoint (tcp 25888 on the node)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"tcp://127.0.0.1:{self.server.getsockname()[1]}"
        self.received = b""
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        connection, _ = self.server.accept()
        with connection:
            while chunk := connection.recv(65536):
                self.received += chunk

    def lines(self) -> list[str]:
        self.thread.join(timeout=5)
        self.server.close()
        return self.received.decode().splitlines()


def test_eks_event_reaches_the_agent_as_a_valid_emf_document_naming_its_log_group():
    # EKS: the pod sends each line, newline-delimited, to the node's agent, which writes it unchanged to the log
    # group named in _aws.LogGroupName (the agent's awscloudwatchlogs exporter reads that member).
    agent = _Agent()
    stream = io.StringIO()
    logger = metrics.MetricsLogger(
        "run-2",
        enabled=True,
        stream=stream,
        environ={"AWS_EMF_AGENT_ENDPOINT": agent.endpoint, "AWS_EMF_LOG_GROUP_NAME": "/efa-training/metrics"},
    )
    logger.step(1, 3.0, 500.0, 0.5)
    logger.step(2, float("nan"), 500.0, 0.5)
    assert logger.agent is not None
    logger.agent.close()
    received = agent.lines()
    assert received == stream.getvalue().splitlines() and len(received) == 2
    for line in received:
        assert emf_problems(line) == []
        assert json.loads(line)["_aws"]["LogGroupName"] == "/efa-training/metrics"


def test_unreachable_agent_never_stops_training(capsys):
    # A closed port: the step is still written to stdout and one warning goes to stderr, not an exception.
    closed = socket.create_server(("127.0.0.1", 0))
    endpoint = f"tcp://127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    stream = io.StringIO()
    logger = metrics.MetricsLogger("run-3", enabled=True, stream=stream, environ={"AWS_EMF_AGENT_ENDPOINT": endpoint})
    logger.step(1, 3.0, 500.0, 0.5)
    logger.step(2, 3.0, 500.0, 0.5)
    assert len(stream.getvalue().splitlines()) == 2
    assert capsys.readouterr().err.count("unreachable") == 1


def test_malformed_agent_endpoint_is_refused_with_its_value():
    with pytest.raises(ValueError, match="AWS_EMF_AGENT_ENDPOINT='udp://x' is not valid; expected tcp://HOST:PORT"):
        metrics.MetricsLogger("r", enabled=True, environ={"AWS_EMF_AGENT_ENDPOINT": "udp://x"})


def test_emf_record_declares_the_dashboard_metric_names():
    rec = metrics.emf_record("run-1", 5, {"Loss": 1.0, "TokensPerSecond": 2.0, "StepTimeSeconds": 0.5, "MFU": 40.0})
    decl = rec["_aws"]["CloudWatchMetrics"][0]
    assert decl["Namespace"] == "EfaTraining" and decl["Dimensions"] == [["RunId"]]
    assert [m["Name"] for m in decl["Metrics"]] == ["Loss", "TokensPerSecond", "StepTimeSeconds", "MFU"]
    assert rec["RunId"] == "run-1" and json.loads(json.dumps(rec)) == rec


@pytest.mark.parametrize("loss", [float("nan"), float("inf")])
def test_non_finite_loss_is_reported_as_a_count_in_valid_json(loss):
    # CloudWatch drops lines that are not JSON; a diverged step must still reach the NonFiniteLoss alarm.
    stream = io.StringIO()
    metrics.MetricsLogger("run-1", enabled=True, stream=stream).step(7, loss, 100.0, 0.5)
    record = json.loads(stream.getvalue(), parse_constant=lambda name: pytest.fail(f"{name} written"))
    assert record["NonFiniteLoss"] == 1 and "Loss" not in record
    assert "Loss" not in [m["Name"] for m in record["_aws"]["CloudWatchMetrics"][0]["Metrics"]]


def test_finite_loss_reports_zero_non_finite_steps():
    # The alarm's metric exists on every healthy step too, so "no data" never hides a diverged run.
    stream = io.StringIO()
    metrics.MetricsLogger("run-1", enabled=True, stream=stream).step(7, 2.5, 100.0, 0.5)
    record = json.loads(stream.getvalue())
    assert (record["NonFiniteLoss"], record["Loss"]) == (0, 2.5)


def test_training_summary_with_infinite_loss_is_strict_json():
    # A diverged run's summary line must still parse: Infinity becomes null.
    stream = io.StringIO()
    metrics.MetricsLogger("run-1", enabled=True, stream=stream).summary({"final_loss": float("inf"), "steps": 3})
    line = json.loads(stream.getvalue(), parse_constant=lambda name: pytest.fail(f"{name} written"))
    assert line["summary"] == {"final_loss": None, "steps": 3}


def test_emf_record_carries_the_environment_dimension_when_the_job_names_one():
    # Alarms and dashboards of one environment query Environment and RunId: the line declares both.
    rec = metrics.emf_record("run-1", 5, {"Loss": 1.0}, environment="prod")
    assert rec["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["Environment", "RunId"]]
    assert (rec["Environment"], rec["RunId"]) == ("prod", "run-1")
    assert metrics.emf_record("run-1", 5, {"Loss": 1.0})["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["RunId"]]


# A deployed run's MFU once more by Environment and Model, in a second directive of the same line: what the next quote
# of that model size reads (contracts/quote.py measured_mfu_query); the other metrics stay by Environment and RunId.
def test_a_deployed_runs_mfu_is_also_put_by_model():
    values = {"Loss": 2.5, "MFU": 41.0, "TokensPerSecond": 100.0}
    record = metrics.emf_record("run-1", 7, values, timestamp_ms=0, environment="prod", model="1.3b")
    assert emf_problems(json.dumps(record)) == []
    by_run, by_model = record["_aws"]["CloudWatchMetrics"]
    assert by_run["Dimensions"] == [["Environment", "RunId"]] and len(by_run["Metrics"]) == 3
    assert by_model == {"Namespace": "EfaTraining", "Dimensions": [["Environment", "Model"]],
                        "Metrics": [{"Name": "MFU", "Unit": "Percent"}]}  # fmt: skip
    assert record["Model"] == "1.3b"


@pytest.mark.parametrize(
    ("values", "environment"), [({"Loss": 2.5}, "prod"), ({"Loss": 2.5, "MFU": 41.0}, None)], ids=["no-mfu", "by-hand"]
)
def test_no_mfu_or_no_environment_puts_nothing_by_model(values, environment):
    record = metrics.emf_record("run-1", 7, values, timestamp_ms=0, environment=environment, model="1.3b")
    assert len(record["_aws"]["CloudWatchMetrics"]) == 1 and "Model" not in record

"""training_image/efa_training/runtime/host_metrics.py alone: the project's own per-host accelerator utilisation
(EfaTraining AcceleratorUtilization, dimensions Environment and Host), from neuron-monitor's JSON or nvidia-smi, as EMF
lines."""

import ast
import json
import socketserver
import threading
from argparse import Namespace
from pathlib import Path

import pytest

from config.layout import TRAINING_METRICS_NAMESPACE
from constructs.observability.accelerator_metrics import ENVIRONMENT_DIMENSION, HOST_DIMENSION, HOST_UTILIZATION
from tests.observability.metrics import training_image_module

host_metrics = training_image_module("host_metrics")

# Assembled from the example objects the Neuron docs print ("Neuron Monitor User Guide", aws-neuron/aws-neuron-sdk
# tools/neuron-sys-tools/neuron-monitor-user-guide.rst): the report's layout, instance_info, neuron_hardware_info and
# the neuroncore_counters group, with its values (two NeuronCores at 42.01 % and 42.02 %).
REPORT = Path(__file__).parent / "fixtures" / "neuron_monitor_report.json"


def _report() -> dict:
    return json.loads(REPORT.read_text())


def _args(**overrides: object) -> Namespace:
    return Namespace(**{"environment": "prod", "host": "i-0abc", "agent": None, "log_group": None, **overrides})


# The documented report's NeuronCores average to the host's utilisation.
def test_neuron_report_gives_the_mean_utilisation_of_the_cores_in_use():
    assert host_metrics.neuron_utilization(_report()) == pytest.approx((42.01 + 42.02) / 2)


# No Neuron application on the host is an idle host, not missing data.
def test_a_host_without_neuron_applications_reads_idle():
    assert host_metrics.neuron_utilization({**_report(), "neuron_runtime_data": []}) == 0.0


# An application whose counters failed to be collected tells nothing: no sample rather than a false 0.
def test_an_application_without_counters_gives_no_sample():
    runtime = {"pid": 7, "error": "failed to connect", "report": {}}
    assert host_metrics.neuron_utilization({**_report(), "neuron_runtime_data": [runtime]}) is None


# nvidia-smi's utilization.gpu lines (csv, noheader, nounits) average over the GPUs that report a number.
def test_gpu_lines_give_the_mean_over_the_gpus():
    assert host_metrics.gpu_utilization("87\n93\n[N/A]\n") == 90.0
    assert host_metrics.gpu_utilization("") is None


# Reports are read whole whether neuron-monitor writes each on one line or over several.
def test_reports_are_read_from_single_and_multi_line_json():
    one_line, indented = json.dumps(_report()), REPORT.read_text()
    lines = [one_line + "\n", *indented.splitlines(keepends=True)]
    assert list(host_metrics.neuron_samples(iter(lines))) == pytest.approx([42.015, 42.015])


# A window emits the mean of its samples once, when it closes, and starts again.
def test_window_emits_one_mean_per_window():
    now = [0.0]
    window = host_metrics.Window(60, clock=lambda: now[0])
    assert window.add(10.0) is None
    now[0] = 61
    assert window.add(30.0) == 20.0
    assert window.add(50.0) is None


# One EMF document: namespace EfaTraining, one dimension set (Environment, Host), the metric in Percent, values at the
# root (CloudWatch user guide, "Specification: Embedded metric format").
def test_emf_record_declares_the_metric_with_environment_and_host():
    record = host_metrics.emf_record("prod", "job-1/algo-2", 42.0, 1700000000000)
    (directive,) = record["_aws"]["CloudWatchMetrics"]
    assert directive == {
        "Namespace": "EfaTraining",
        "Dimensions": [["Environment", "Host"]],
        "Metrics": [{"Name": "AcceleratorUtilization", "Unit": "Percent"}],
    }
    assert (record["Environment"], record["Host"], record["AcceleratorUtilization"]) == ("prod", "job-1/algo-2", 42.0)


# The dashboard and alarm read the names the exporter writes (constructs/observability/accelerator_metrics.py).
def test_the_cdk_side_reads_the_exporters_names():
    assert (TRAINING_METRICS_NAMESPACE, HOST_UTILIZATION) == (host_metrics.NAMESPACE, host_metrics.METRIC)
    assert (ENVIRONMENT_DIMENSION, HOST_DIMENSION) == host_metrics.DIMENSIONS


# From neuron-monitor's output to the line on stdout: one EMF document per window.
def test_publish_writes_one_emf_line_per_window_to_stdout(capsys):
    lines = iter([json.dumps(_report()) + "\n"] * 2)
    host_metrics.publish(host_metrics.neuron_samples(lines), _args(), host_metrics.Window(0))
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [p["Host"] for p in printed] == ["i-0abc", "i-0abc"]
    assert [p["AcceleratorUtilization"] for p in printed] == pytest.approx([42.015, 42.015])


class _Received(socketserver.StreamRequestHandler):
    lines: list[bytes] = []

    def handle(self) -> None:
        _Received.lines.append(self.rfile.readline())


# With --agent the line goes, newline-terminated, to the CloudWatch agent's TCP EMF listener, with the log group the
# agent writes it to (CloudWatch user guide, "Using the CloudWatch agent to send embedded metric format logs").
def test_publish_sends_to_the_agents_listener():
    with socketserver.TCPServer(("127.0.0.1", 0), _Received) as server:
        thread = threading.Thread(target=server.handle_request)
        thread.start()
        agent = f"tcp://127.0.0.1:{server.server_address[1]}"
        args = _args(agent=agent, log_group="/efa-training/prod/batch-host-metrics")
        host_metrics.publish(iter([55.0]), args, host_metrics.Window(0))
        thread.join(timeout=10)
    (line,) = _Received.lines
    assert line.endswith(b"\n") and json.loads(line)["_aws"]["LogGroupName"] == "/efa-training/prod/batch-host-metrics"


def _ml_root(tmp_path: Path) -> Path:
    config = tmp_path / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text(json.dumps({"current_host": "algo-2", "hosts": ["algo-1", "algo-2"]}))
    return tmp_path


# On SageMaker, train publishes this instance as <training job name>/<current_host>, from its accelerator kind.
@pytest.mark.parametrize(("kind", "source"), [("gpu", "gpu"), ("neuron", "neuron")])
def test_sagemaker_train_publishes_this_instance(tmp_path, kind, source):
    env = {"TRAINING_ENVIRONMENT": "prod", "TRAINING_JOB_NAME": "run-1-train-ab12cd34", "ACCELERATOR_KIND": kind}
    command = host_metrics.command_beside("train", env, _ml_root(tmp_path))
    assert command is not None and command[2:] == [
        source,
        "--environment",
        "prod",
        "--host",
        "run-1-train-ab12cd34/algo-2",
    ]


# The one-GPU validation job never publishes (it must not count against the training type's idle threshold), nor does
# a hand run outside a deployed environment.
@pytest.mark.parametrize(("mode", "environment"), [("validate", "prod"), ("train", "")])
def test_validation_and_hand_runs_publish_nothing(tmp_path, mode, environment):
    env = {"TRAINING_ENVIRONMENT": environment, "TRAINING_JOB_NAME": "j"}
    assert host_metrics.command_beside(mode, env, _ml_root(tmp_path)) is None


# The Batch hosts run the exporter on their own python3, 3.9 on Amazon Linux 2023 (AL2023 user guide, "Python in
# AL2023": /usr/bin/python3 "will remain as Python 3.9 for the life of AL2023").
def test_the_exporter_is_python_3_9():
    tree = ast.parse(Path(str(host_metrics.__file__)).read_text(), feature_version=(3, 9))
    assert isinstance(tree, ast.Module) and tree.body
    with pytest.raises(SyntaxError):  # the check has teeth: 3.10 syntax is refused at 3.9
        ast.parse("match x:\n    case 1:\n        pass\n", feature_version=(3, 9))

"""This host's accelerator utilisation as CloudWatch embedded metric format (EMF) lines, one a minute: namespace
EfaTraining, metric AcceleratorUtilization (percent: the mean over the host's GPUs or NeuronCores), dimensions
Environment and Host. Where the idle alarm reads it, and why: constructs/observability/accelerator_metrics.py.
- SageMaker: launch.py runs it beside `train` (never `validate`), printing to the job log; Host = <job>/<current_host>.
- Batch Trainium hosts: a service sends the lines to the CloudWatch agent's EMF listener (--agent); Host = instance id.
Sources: nvidia-smi's utilization.gpu every SAMPLE_SECONDS; neuron-monitor's JSON reports (Neuron docs, "Neuron Monitor
User Guide"), neuron_runtime_data[].report.neuroncore_counters.neuroncores_in_use.<index>.neuroncore_utilization.
Standard library and Python 3.9 only: the Batch hosts run it on Amazon Linux 2023's python3.

    host_metrics.py {gpu|neuron} --environment ENV --host HOST [--agent tcp://HOST:PORT --log-group NAME]
"""

from __future__ import annotations

import argparse
import atexit
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from urllib.parse import urlparse

NAMESPACE = "EfaTraining"
METRIC = "AcceleratorUtilization"
DIMENSIONS = ("Environment", "Host")
WINDOW_SECONDS = 60  # one EMF line per minute: the mean of the samples taken in it
SAMPLE_SECONDS = 10
NEURON_MONITOR = "/opt/aws/neuron/bin/neuron-monitor"  # aws-neuronx-tools' install path (Neuron Monitor User Guide)
NVIDIA_SMI = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]


def gpu_utilization(csv_text: str) -> float | None:
    """The mean of nvidia-smi's per-GPU utilization.gpu lines; None when no GPU reported a number."""
    values = []
    for line in csv_text.splitlines():
        try:
            values.append(float(line.strip()))
        except ValueError:  # "[N/A]", "[Not Supported]", blank
            continue
    return sum(values) / len(values) if values else None


def neuron_utilization(report: Mapping) -> float | None:
    """The mean NeuronCore utilisation of one neuron-monitor report: every core any Neuron application has in use.
    No application at all is an idle host (0.0); applications whose counters are missing (an error) tell nothing."""
    runtimes = report.get("neuron_runtime_data")
    if not isinstance(runtimes, list):
        return None
    values, counted = [], not runtimes
    for runtime in runtimes:
        counters = ((runtime or {}).get("report") or {}).get("neuroncore_counters") or {}
        cores = counters.get("neuroncores_in_use")
        if isinstance(cores, dict):
            counted = True
            values += [c["neuroncore_utilization"] for c in cores.values() if _number(c, "neuroncore_utilization")]
    if values:
        return sum(values) / len(values)
    return 0.0 if counted else None


def _number(mapping: object, key: str) -> bool:
    return isinstance(mapping, dict) and isinstance(mapping.get(key), (int, float))


def emf_record(environment: str, host: str, value: float, timestamp_ms: int, log_group: str | None = None) -> dict:
    """One EMF document (CloudWatch user guide, "Specification: Embedded metric format")."""
    metadata: dict = {
        "Timestamp": timestamp_ms,
        "CloudWatchMetrics": [
            {"Namespace": NAMESPACE, "Dimensions": [list(DIMENSIONS)], "Metrics": [{"Name": METRIC, "Unit": "Percent"}]}
        ],
    }
    if log_group:
        metadata["LogGroupName"] = log_group  # read by the CloudWatch agent, which writes the line there
    return {"_aws": metadata, "Environment": environment, "Host": host, METRIC: value}


class Window:
    """Samples in, one mean out per `seconds` (None while the window is open, or when it held no sample)."""

    def __init__(self, seconds: float = WINDOW_SECONDS, clock=time.monotonic) -> None:
        self.seconds, self.clock = seconds, clock
        self.values: list[float] = []
        self.start = clock()

    def add(self, value: float | None) -> float | None:
        if value is not None:
            self.values.append(value)
        if self.clock() - self.start < self.seconds:
            return None
        mean = sum(self.values) / len(self.values) if self.values else None
        self.values, self.start = [], self.clock()
        return mean


def send(line: str, agent: tuple[str, int] | None) -> None:
    """To stdout, or to the agent's TCP listener (one newline-terminated document per connection). Never raises."""
    if agent is None:
        print(line, flush=True)
        return
    try:
        with socket.create_connection(agent, timeout=2) as connection:
            connection.sendall(line.encode() + b"\n")
    except OSError as error:
        print(f"host_metrics: CloudWatch agent at {agent[0]}:{agent[1]} unreachable ({error})", file=sys.stderr)


def gpu_samples(run=subprocess.run, sleep=time.sleep) -> Iterator[float | None]:
    while True:
        try:
            yield gpu_utilization(run(NVIDIA_SMI, capture_output=True, text=True, timeout=30).stdout)
        except (OSError, subprocess.SubprocessError):
            yield None
        sleep(SAMPLE_SECONDS)


def json_documents(lines: Iterator[str], limit: int = 16 * 2**20) -> Iterator[object]:
    """The JSON documents in a text stream, whether each takes one line or several (neuron-monitor writes "a complete
    JSON" per report and documents no framing). Text that never completes a document within `limit` is dropped."""
    decoder, buffer = json.JSONDecoder(), ""
    for line in lines:
        buffer += line
        while buffer.strip():
            try:
                document, end = decoder.raw_decode(buffer.lstrip())
            except ValueError:  # incomplete: wait for more, unless it cannot be a report (or never ends)
                buffer = buffer if buffer.lstrip().startswith("{") and len(buffer) <= limit else ""
                break
            buffer = buffer.lstrip()[end:]
            yield document


def neuron_samples(lines: Iterator[str]) -> Iterator[float | None]:
    for document in json_documents(lines):
        yield neuron_utilization(document) if isinstance(document, dict) else None


def publish(samples: Iterator[float | None], args: argparse.Namespace, window: Window | None = None) -> None:
    window = window or Window()
    agent = _agent(args.agent)
    for sample in samples:
        mean = window.add(sample)
        if mean is not None:
            record = emf_record(args.environment, args.host, mean, int(time.time() * 1000), args.log_group)
            send(json.dumps(record), agent)


def _agent(endpoint: str | None) -> tuple[str, int] | None:
    if not endpoint:
        return None
    url = urlparse(endpoint)
    if url.scheme != "tcp" or not url.hostname or not url.port:
        raise SystemExit(f"host_metrics: --agent {endpoint!r} is not tcp://HOST:PORT")
    return url.hostname, url.port


def command_beside(mode: str, env: Mapping[str, str], ml_root: Path) -> list[str] | None:
    """On SageMaker: the command that publishes this instance's utilisation while `mode` runs, or None (only `train`
    publishes, and only in a deployed environment, which sets TRAINING_ENVIRONMENT)."""
    environment = env.get("TRAINING_ENVIRONMENT")
    if mode != "train" or not environment:
        return None
    current_host = json.loads((ml_root / "input/config/resourceconfig.json").read_text())["current_host"]
    job = env.get("TRAINING_JOB_NAME") or env.get("RUN_ID") or "sagemaker"
    source = "neuron" if env.get("ACCELERATOR_KIND") == "neuron" else "gpu"
    script = str(Path(__file__).resolve())
    return [sys.executable, script, source, "--environment", environment, "--host", f"{job}/{current_host}"]


def start_beside(mode: str, env: Mapping[str, str], ml_root: Path) -> subprocess.Popen | None:
    """Starts command_beside's publisher as a child that ends with this process. Metrics never stop a job."""
    try:
        command = command_beside(mode, env, ml_root)
        if command is None:
            return None
        child = subprocess.Popen(command, env=dict(env))
    except (OSError, ValueError, KeyError) as error:
        print(f"host_metrics: not publishing this host's utilisation ({error})", file=sys.stderr, flush=True)
        return None
    atexit.register(child.terminate)
    return child


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", choices=("gpu", "neuron"))
    parser.add_argument("--environment", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--agent", help="tcp://HOST:PORT of the CloudWatch agent's EMF listener; stdout without")
    parser.add_argument("--log-group", help="the log group the agent writes the lines to")
    parser.add_argument("--neuron-monitor", default=NEURON_MONITOR)
    args = parser.parse_args(argv)
    if args.source == "gpu":
        publish(gpu_samples(), args)
        return 0
    try:
        monitor = subprocess.Popen([args.neuron_monitor], stdout=subprocess.PIPE, text=True)
    except OSError as error:
        print(f"host_metrics: cannot run {args.neuron_monitor} ({error})", file=sys.stderr)
        return 1
    assert monitor.stdout is not None
    publish(neuron_samples(iter(monitor.stdout)), args)
    return monitor.wait()


if __name__ == "__main__":
    sys.exit(main())

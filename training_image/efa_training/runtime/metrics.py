"""Per-step metrics as CloudWatch Embedded Metric Format (EMF) JSON lines.

Every line goes to stdout. On Batch the awslogs driver sends stdout to CloudWatch Logs with PutLogEvents,
each line one event with the EMF document at its root, and CloudWatch extracts the metrics (CloudWatch user
guide, CloudWatch_Embedded_Metric_Format_Generation_PutLogEvents.html). On EKS the observability add-on's
Fluent Bit wraps each stdout line ({"log": ..., "kubernetes": ...}), so `_aws` is no longer at the root and
nothing would be extracted: there the pod gets AWS_EMF_AGENT_ENDPOINT (the node's CloudWatch agent, which
listens for EMF on TCP 25888, CloudWatch_Embedded_Metric_Format_Generation_CloudWatch_Agent.html) and
AWS_EMF_LOG_GROUP_NAME, and each line is also sent there unchanged, with `_aws.LogGroupName` naming the log
group the agent writes it to. Names are a contract with the dashboards: Loss, TokensPerSecond,
StepTimeSeconds, MFU, NonFiniteLoss in namespace EfaTraining with dimensions Environment and RunId (Environment
from TRAINING_ENVIRONMENT, which every job of a deployed environment gets; RunId alone for hand runs). A deployed
run that names its model also puts MFU by Environment and Model (a second directive of the same line), which the
next run's quote reads for its own model size (contracts/quote.py measured_mfu_query).
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import time
from typing import TextIO
from urllib.parse import urlparse

NAMESPACE = "EfaTraining"
PROGRESS_METRIC = "ProgressLines"
# A node that is up but not training (launch/stage_heartbeat.py): the idle alarm does not page while any node says so.
NOT_TRAINING_METRIC = "NotTraining"
UNITS = {
    NOT_TRAINING_METRIC: "Count",
    "Loss": "None",
    "TokensPerSecond": "Count/Second",
    "StepTimeSeconds": "Seconds",
    "MFU": "Percent",
    "NonFiniteLoss": "Count",
    # 1 on every line that reports training progress, whatever the workload: the NoProgress alarm's sum
    # (constructs/observability/alarms.py), which holds when hosts are up and none came.
    "ProgressLines": "Count",
    # Stragglers (runtime/stragglers.py): the slowest rank's device probe over the median, the longest input wait
    "StragglerRatio": "None",
    # How long the same rank has stayed the slowest at 1.5 x the median: the <prefix>-straggler alarm's metric
    "StragglerPersistSeconds": "Seconds",
    # The longest checkpoint save so far: the launcher stops a training this many times earlier before its
    # reservation ends (runtime/launch/stop_by.py)
    "CheckpointSaveSeconds": "Seconds",
    "DataWaitSeconds": "Seconds",
    # The parameter-server strategy's (workloads/ctr_ps/worker.py), one line per worker and step
    "SamplesPerSecond": "Count/Second",
    "PullLatencyMs": "Milliseconds",
    "PushLatencyMs": "Milliseconds",
    "StalenessSteps": "Count",
    "RowsTouched": "Count",
}

# Dense bf16 peak TFLOPS per accelerator, by device-name substring, first match wins (so L40S before L4). The
# jobs of a deployed environment set PEAK_TFLOPS_PER_ACCELERATOR from config/catalogue.py, which takes precedence;
# this table serves hand runs, and tests/training/test_catalogue_contract.py holds it equal to the catalogue.
#   A10G: 70 dense (140 with sparsity), NVIDIA's A10G datasheet for AWS
#     (d1.awsstatic.com/product-marketing/ec2/NVIDIA_AWS_A10G_DataSheet_FINAL_02_17_2022.pdf); the 125 of the A10's
#     datasheet is another GPU's figure.
#   Trainium (trn1): 190 per chip, two NeuronCores (Neuron docs, "Trainium Architecture").
#   Trainium2 (trn2): 667 per chip (Neuron docs, "Trainium2 Architecture"); listed before "Trainium", which it contains.
#   H100/H200 SXM 989, A100 312, L40S 362, L4 121: NVIDIA's datasheets, dense.
#   B200 (HGX, 1,000 W): 2,250 dense (NVIDIA's table gives 4.5 PFLOPS with sparsity; config/catalogue.py says more).
PEAK_BF16_TFLOPS = {
    "B200": 2250.0,
    "H200": 989.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "A10G": 70.0,
    "L4": 121.0,
    "Trainium2": 667.0,
    "Trainium": 190.0,
}


def peak_tflops(device_name: str) -> float | None:
    """bf16 peak of one accelerator: PEAK_TFLOPS_PER_ACCELERATOR where the job sets it, else the table's."""
    override = os.environ.get("PEAK_TFLOPS_PER_ACCELERATOR")
    if override:
        return float(override)
    return next((value for key, value in PEAK_BF16_TFLOPS.items() if key in device_name), None)


def emf_record(
    run_id: str,
    step: int,
    values: dict[str, float],
    timestamp_ms: int | None = None,
    log_group: str | None = None,
    environment: str | None = None,
    model: str | None = None,
) -> dict:
    """One EMF document: metrics declared under _aws, values and dimensions at top level.

    A non-finite value is left out (the specification's metric values are JSON numbers, and NaN/Infinity are
    not JSON), so one diverged value never makes the whole line, and every other metric on it, invalid."""
    values = {k: v for k, v in values.items() if not isinstance(v, float) or math.isfinite(v)}
    names = [n for n in values if n in UNITS]
    directives: list[dict] = [
        {
            "Namespace": NAMESPACE,
            "Dimensions": [["Environment", "RunId"] if environment else ["RunId"]],
            "Metrics": [{"Name": n, "Unit": UNITS[n]} for n in names],
        }
    ]
    by_model = bool(environment and model and "MFU" in names)
    if by_model:  # MFU once more, by Environment and Model: what a quote of the same model size reads
        directives.append(
            {
                "Namespace": NAMESPACE,
                "Dimensions": [["Environment", "Model"]],
                "Metrics": [{"Name": "MFU", "Unit": "Percent"}],
            }
        )
    metadata: dict[str, object] = {
        "Timestamp": timestamp_ms if timestamp_ms is not None else int(time.time() * 1000),
        "CloudWatchMetrics": directives,
    }
    if log_group:
        metadata["LogGroupName"] = log_group  # read by the CloudWatch agent, not by CloudWatch Logs
    return {
        "_aws": metadata,
        **({"Environment": environment} if environment else {}),
        **({"Model": model} if by_model else {}),
        "RunId": run_id,
        "Step": step,  # a property, not a dimension: one metric stream per run, not per step
        **values,
    }


class AgentSink:
    """Newline-delimited EMF lines to the CloudWatch agent's TCP endpoint (tcp://host:port). Metrics never stop
    training: a failed send is reported once on stderr and retried with a new connection on the next line."""

    def __init__(self, endpoint: str, timeout_s: float = 2.0) -> None:
        url = urlparse(endpoint)
        if url.scheme != "tcp" or not url.hostname or not url.port:
            raise ValueError(f"AWS_EMF_AGENT_ENDPOINT={endpoint!r} is not valid; expected tcp://HOST:PORT")
        self.address, self.timeout_s = (url.hostname, url.port), timeout_s
        self._socket: socket.socket | None = None
        self._warned = False

    def send(self, line: str) -> None:
        try:
            if self._socket is None:
                self._socket = socket.create_connection(self.address, timeout=self.timeout_s)
            self._socket.sendall(line.encode() + b"\n")
        except OSError as error:
            self.close()
            if not self._warned:
                print(
                    f"metrics: CloudWatch agent at {self.address[0]}:{self.address[1]} unreachable ({error}); "
                    "EMF lines stay on stdout only until it answers",
                    file=sys.stderr,
                )
                self._warned = True

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


class MetricsLogger:
    def __init__(
        self, run_id: str, enabled: bool, stream: TextIO = sys.stdout, environ=os.environ, model: str | None = None
    ) -> None:
        """`model`: the model size the run trains, whose MFU is also put by Environment and Model (emf_record)."""
        self.run_id, self.enabled, self.stream, self.model = run_id, enabled, stream, model
        endpoint = environ.get("AWS_EMF_AGENT_ENDPOINT")
        self.agent = AgentSink(endpoint) if enabled and endpoint else None
        self.log_group = environ.get("AWS_EMF_LOG_GROUP_NAME") if self.agent else None

    def step(
        self,
        step: int,
        loss: float,
        tokens_per_s: float,
        step_time_s: float,
        mfu_percent: float | None = None,
        properties: dict[str, object] | None = None,
        **extra: float,
    ) -> None:
        if not self.enabled:
            return
        # NaN/inf is not valid JSON, and CloudWatch would drop the whole line: a diverged run reports
        # NonFiniteLoss=1 (which the NonFiniteLoss alarm watches) and leaves Loss out of that line.
        finite = math.isfinite(loss)
        values = {"NonFiniteLoss": 0 if finite else 1, "TokensPerSecond": tokens_per_s, "StepTimeSeconds": step_time_s,
                  PROGRESS_METRIC: 1}  # fmt: skip
        if finite:
            values["Loss"] = loss
        if mfu_percent is not None:
            values["MFU"] = mfu_percent
        values.update(extra)
        self.record(step, values, **(properties or {}))

    def record(self, step: int, values: dict[str, float], **properties: object) -> None:
        """One EMF line of these values (names in UNITS are metrics; `properties` ride along, not as dimensions)."""
        if not self.enabled:
            return
        document = emf_record(
            self.run_id,
            step,
            values,
            log_group=self.log_group,
            environment=os.environ.get("TRAINING_ENVIRONMENT") or None,
            model=self.model,
        )
        line = json.dumps({**document, **properties}, allow_nan=False)
        self.stream.write(line + "\n")
        self.stream.flush()
        if self.agent is not None:
            self.agent.send(line)

    def summary(self, summary: dict) -> None:
        if self.enabled:
            # Strict JSON: a NaN/Infinity anywhere (a diverged run) becomes null instead of a line
            # that JSON parsers and CloudWatch reject.
            self.stream.write(json.dumps({"summary": finite_or_none(summary)}, allow_nan=False) + "\n")
            self.stream.flush()


def finite_or_none(obj):
    """`obj` with every non-finite float replaced by None (recursively through dicts and lists)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj


def parse_emf_lines(lines) -> list[dict]:
    """Read back EMF records (for local_run's plot and the tests)."""
    out = []
    for line in lines:
        line = line.strip()
        if line.startswith("{") and '"_aws"' in line:
            out.append(json.loads(line))
    return out

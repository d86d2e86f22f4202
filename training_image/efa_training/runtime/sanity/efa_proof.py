"""Evidence that the collectives really run over EFA: devices the container can use, and NCCL's own choice.

A container can train "successfully" without EFA: when aws-ofi-nccl fails to initialise, NCCL logs
`NET/OFI ... initialization failed` and quietly uses its own sockets (17x slower in our seeds' table), and
FI_PROVIDER=efa does not prevent that (it only stops libfabric from picking another provider). So the sanity
check proves three things on every node before any training:

1. devices: the container sees exactly the catalogue's number of EFA interfaces, as uverbs devices
   (/dev/infiniband/uverbsN, one per interface: EC2 user guide, "Get started with EFA and NCCL") and as
   domains of libfabric's `efa` provider (`fi_info -p efa -t FI_EP_RDM`, the EFA installer's own check);
2. transport: NCCL's initialisation log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET, written to
   NCCL_DEBUG_FILE) says `Using network <Libfabric plugin>` (NCCL src/init.cc: "Using network %s") and
   aws-ofi-nccl says `NET/OFI Selected provider is efa, fabric is efa` (or `efa-direct`; aws-ofi-nccl v1.14.0 on:
   "Selected provider is %s, fabric is %s (found %d nics)", src/nccl_ofi_net.cpp; v1.13 and before wrote
   "Selected Provider is %s (found %d nics)", also accepted);
   a `Using network Socket` or a missing provider line fails with one line naming what was found;
3. bandwidth (checks.py): the bus bandwidth at one fixed large message against the catalogue's threshold.

Neuron: the Neuron runtime's collectives load the same aws-ofi-nccl plugin and log the same provider line
with NCCL_DEBUG=INFO; whether it honours NCCL_DEBUG_FILE is not confirmed here (no Trainium host to try).
Everything below is pure parsing plus two small probes, so tests feed recorded outputs through it;
`group_failures` turns the whole group's agreed counts and this rank's own evidence into the report's lines.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import MutableMapping
from dataclasses import asdict, dataclass
from pathlib import Path

UVERBS_DIR = "/dev/infiniband"
# Where the EFA installer puts libfabric's tools in the DLC and our images; PATH is searched first.
FI_INFO_CANDIDATES = ("fi_info", "/opt/amazon/efa/bin/fi_info")
TRANSPORTS = ("efa", "socket", "ib", "unknown")  # ordered best to worst: ranks combine verdicts with MAX

_USING_NETWORK = re.compile(r"NCCL INFO Using network (?P<name>.+?)\s*$", re.MULTILINE)
_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is (?P<provider>[\w;-]+)(?:, fabric is [\w-]+)?")
_OFI_FAILED = re.compile(r"NET/OFI .*(?:initiali[sz]ation failed|Failed to initialize).*", re.IGNORECASE)
_DOMAIN = re.compile(r"^\s*domain:\s*(?P<domain>\S+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Transport:
    kind: str  # one of TRANSPORTS
    network: str | None  # NCCL's "Using network ..." name
    provider: str | None  # aws-ofi-nccl's selected libfabric provider
    evidence: str  # the log line the verdict rests on, for the report


def nccl_transport(log: str) -> Transport:
    """What NCCL used, from its own initialisation log (NCCL_DEBUG=INFO with INIT and NET)."""
    networks = [m.group("name") for m in _USING_NETWORK.finditer(log)]
    provider_match = _PROVIDER.search(log)
    provider = provider_match.group("provider").split(";")[0].lower() if provider_match else None
    provider_line = provider_match.group(0) if provider_match else ""
    network = networks[-1] if networks else None
    if network and "socket" in network.lower():
        failed = _OFI_FAILED.search(log)
        return Transport("socket", network, provider, (failed.group(0) if failed else f"Using network {network}"))
    if network and network.strip().upper() == "IB":
        return Transport("ib", network, provider, f"Using network {network}")
    if network and re.search(r"libfabric|ofi", network, re.IGNORECASE) and provider == "efa":
        return Transport("efa", network, provider, provider_line)
    if provider == "efa" and network is None:  # Neuron's collectives log the provider, not NCCL's network line
        return Transport("efa", None, provider, provider_line)
    evidence = (
        f"Using network {network}, provider {provider or 'none'}"
        if network
        else "no 'Using network' line and no 'Selected provider is efa' line in NCCL's log"
    )
    return Transport("unknown", network, provider, evidence)


def efa_domains(fi_info_output: str) -> set[str]:
    """The EFA devices libfabric's efa provider offers: one RDM domain per interface (rdmapXsY-rdm)."""
    return {m.group("domain") for m in _DOMAIN.finditer(fi_info_output) if m.group("domain").endswith("-rdm")}


def uverbs_devices(directory: str = UVERBS_DIR) -> list[str]:
    path = Path(directory)
    return sorted(p.name for p in path.glob("uverbs*")) if path.is_dir() else []


def run_fi_info(command: str | None = None, timeout: float = 30.0) -> tuple[str, str | None]:
    """(output, problem): `fi_info -p efa -t FI_EP_RDM`, or why it could not run."""
    candidates = (command,) if command else FI_INFO_CANDIDATES
    binary = next(
        (found for c in candidates if (found := shutil.which(c) or (c if os.access(c, os.X_OK) else None))), None
    )
    if binary is None:
        return "", f"libfabric's fi_info not found ({', '.join(candidates)}): the image lacks the EFA software"
    try:
        run = subprocess.run(
            [binary, "-p", "efa", "-t", "FI_EP_RDM"], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "", f"fi_info did not run: {type(exc).__name__}: {exc}"
    # fi_info exits non-zero with "No data available" when the efa provider finds no device.
    return run.stdout, None if run.returncode == 0 else (run.stderr.strip().splitlines() or ["no output"])[-1]


def debug_file(template: str) -> str:
    """NCCL_DEBUG_FILE's path for this process: NCCL expands %h to the hostname cut at its first '.' (NCCL
    src/debug.cc, getHostName(..., '.')) and %p to the pid. Batch awsvpc containers are named by their private
    DNS name (ip-10-0-1-5.ec2.internal), so the full hostname would name another file."""
    return template.replace("%h", socket.gethostname().split(".", 1)[0]).replace("%p", str(os.getpid()))


def prepare_nccl_logging(env: MutableMapping[str, str], rank: int, directory: str = "/tmp") -> str:
    """Make NCCL write the lines `nccl_transport` reads, to a file of this process; returns its path.

    Call before the process group exists (NCCL reads its environment at communicator creation).
    """
    env["NCCL_DEBUG"] = "INFO" if env.get("NCCL_DEBUG", "").upper() not in ("INFO", "TRACE") else env["NCCL_DEBUG"]
    subsystems = [s for s in env.get("NCCL_DEBUG_SUBSYS", "").split(",") if s]
    if subsystems and not subsystems[0].startswith("^") and "ALL" not in subsystems:
        subsystems += [s for s in ("INIT", "NET") if s not in subsystems]
        env["NCCL_DEBUG_SUBSYS"] = ",".join(subsystems)
    elif not subsystems or subsystems[0].startswith("^"):
        env["NCCL_DEBUG_SUBSYS"] = "INIT,NET"
    # One file per rank inside this container's own /tmp: no hostname needed in the name.
    env.setdefault("NCCL_DEBUG_FILE", os.path.join(directory, f"nccl-sanity.rank{rank}.log"))
    return debug_file(env["NCCL_DEBUG_FILE"])


@dataclass(frozen=True)
class EfaEvidence:
    expected_interfaces: int
    uverbs: list[str]
    fi_info_domains: list[str]
    fi_info_problem: str | None
    transport: Transport
    # Neuron: the runtime's collectives are not known here to write NCCL_DEBUG_FILE, so an empty log is "not
    # seen" (a warning), while positive evidence of another transport still fails.
    transport_proof_required: bool = True
    # SageMaker documents no EFA device count per ml. type: where the count is not confirmed (EFA_COUNT_CONFIRMED=0),
    # any EFA device with the transport's proof passes, and the count found is reported to be recorded.
    count_confirmed: bool = True

    def notes(self) -> list[str]:
        if self.count_confirmed or len(self.uverbs) == self.expected_interfaces:
            return []
        return [
            f"EFA devices: {len(self.uverbs)} found where EC2 documents {self.expected_interfaces} for this type; "
            "this backend's count is not confirmed: record it in the catalogue (sagemaker_efa_interfaces)"
        ]

    def warnings(self) -> list[str]:
        if self.transport.kind == "unknown" and not self.transport_proof_required:
            return [
                f"transport: not proven ({self.transport.evidence}); this accelerator's runtime may not write "
                "NCCL's debug file: check its log for 'Selected provider is efa'"
            ]
        return []

    def failures(self) -> list[str]:
        """One line per broken proof, naming what was found."""
        problems = []
        n = self.expected_interfaces if self.count_confirmed else max(len(self.uverbs), 1)
        if len(self.uverbs) != n:
            problems.append(
                f"EFA devices: {len(self.uverbs)} of {n} /dev/infiniband/uverbs* visible in the container "
                f"({', '.join(self.uverbs) or 'none'}); the job definition must map every interface"
            )
        if self.fi_info_problem:
            problems.append(f"EFA devices: libfabric's efa provider unusable: {self.fi_info_problem}")
        elif len(self.fi_info_domains) != n:
            problems.append(
                f"EFA devices: libfabric's efa provider offers {len(self.fi_info_domains)} of {n} "
                f"devices ({', '.join(self.fi_info_domains) or 'none'})"
            )
        if self.transport.kind != "efa" and not self.warnings():
            problems.append(f"transport: NCCL used {self.transport.kind} ({self.transport.evidence}), not EFA")
        return problems

    def report(self) -> dict:
        return {
            **asdict(self),
            "transport": asdict(self.transport),
            "failures": self.failures(),
            "warnings": self.warnings(),
            "notes": self.notes(),
        }


def collect(
    expected_interfaces: int,
    nccl_log_path: str,
    *,
    uverbs_dir: str = UVERBS_DIR,
    fi_info: str | None = None,
    transport_proof_required: bool = True,
    count_confirmed: bool = True,
) -> EfaEvidence:
    """This process's evidence: its own NCCL log, and the node's devices (uverbs and libfabric's view)."""
    try:
        transport = nccl_transport(Path(nccl_log_path).read_text(errors="replace"))
    except OSError as exc:
        transport = Transport("unknown", None, None, f"NCCL's debug log {nccl_log_path} unreadable: {exc.strerror}")
    output, problem = run_fi_info(fi_info)
    return EfaEvidence(
        expected_interfaces,
        uverbs_devices(uverbs_dir),
        sorted(efa_domains(output)),
        problem,
        transport,
        transport_proof_required,
        count_confirmed,
    )


def group_failures(own: dict, bad_devices: int, worst_transport: int) -> list[str]:
    """The group's EFA failure lines: `own` is this rank's report, `bad_devices` the nodes whose devices failed and
    `worst_transport` the index in TRANSPORTS of the worst transport any rank saw (0: EFA everywhere)."""
    failures = []
    if bad_devices:
        mine = [f for f in own.get("failures", []) if f.startswith("EFA devices")]
        failures.append(
            mine[0] + (f" (and {bad_devices - 1} more node(s))" if bad_devices > 1 else "")
            if mine
            else f"EFA devices: wrong on {bad_devices} node(s); see those nodes' logs"
        )
    if worst_transport:
        found = TRANSPORTS[worst_transport]
        failures.append(
            f"transport: NCCL used {found} ({own['transport']['evidence']}), not EFA"
            if own["transport"]["kind"] == found
            else f"transport: NCCL used {found}, not EFA, on another rank; see its log"
        )
    return failures

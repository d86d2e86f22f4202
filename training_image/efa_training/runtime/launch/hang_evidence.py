"""The evidence of a hang, kept under the run's folder (`runs/<run_id>/hang/`) and named in one summary line.

What the watchdog (watchdog.py) records before it ends the attempt, per worker on this node: its rank (RANK in its
environment, as torchrun set it), its process state, and its Python stacks (faulthandler's dump on SIGABRT, read off
the launcher's stderr, one worker at a time). From them it names the rank that stopped first:
  - a worker the kernel holds stopped (state T: SIGSTOP, a debugger), which every other rank then waits for;
  - else a worker outside any collective while the others wait inside one (their stacks end in torch.distributed):
    the rank they wait for;
  - else the one worker running (state R) while every other sleeps (S): DDP waits for gradients inside backward,
    in C++, where no stack shows a collective, so a rank spinning in its own code is told by its state;
  - else none: every rank waits in a collective, a fault of the network or the communication library, which NCCL's
    own Flight Recorder traces (FLIGHT_RECORDER, written on NCCL's collective timeout) show in detail.

On several nodes the main node's watchdog, before it stops its own workers, asks the others for theirs: it writes
`hang/request.json` naming the attempt's folder; each other node's launcher (a peer watchdog, polling the shared
run folder) takes its workers' stacks into that folder with `node-<N>.json` describing them, and the main node waits
for them (at most PEER_WAIT_SECONDS) before it names the rank that stopped first among all of them. Where the run's
folder is not shared (SageMaker) only the main node's workers are in the evidence.

Files: `summary.json` (the summary line's content), `stacks-rank<R>.txt` per worker, and NCCL's traces as
`flight-recorder/rank_<R>` (PyTorch's Flight Recorder tutorial: TORCH_NCCL_TRACE_BUFFER_SIZE > 0 records the
collectives, TORCH_NCCL_DUMP_ON_TIMEOUT=1 writes them on a timeout to TORCH_FR_DUMP_TEMP_FILE + rank;
https://docs.pytorch.org/tutorials/unstable/flight_recorder_tutorial.html).
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Mapping
from pathlib import Path

from efa_training.runtime.launch.sagemaker import ml_root, on_sagemaker
from efa_training.runtime.run_paths import flag_value

HANG_FOLDER = "hang"
REQUEST = "request.json"  # the main node's ask for the other nodes' stacks: {"folder": <the attempt's folder>}
PEER_WAIT_SECONDS = 30.0  # how long the main node waits for the other nodes' stacks
# A frame in torch.distributed (c10d's collectives, FSDP's and DTensor's calls into them), as faulthandler prints it.
COLLECTIVE_FRAME = re.compile(r'File "[^"]*/torch/distributed/[^"]*", line \d+ in \w+')
# The recorder's size in entries (the tutorial's example; each entry is one collective with its stack).
TRACE_BUFFER_ENTRIES = "2000"


def run_folder(env: Mapping[str, str], script_args: list[str]) -> Path | None:
    """The run's folder on this node: the job's --run-dir; on SageMaker its output data, which SageMaker uploads as
    output.tar.gz "at the end of the training job" (your-algorithms-training-algo-output.html; whether also after a
    failure the page does not say); else the shared file system's runs/<run_id>; None where none is known (a hand run
    without a run id)."""
    explicit = flag_value(script_args, "--run-dir")
    if explicit:
        return Path(explicit)
    if on_sagemaker(env):
        return ml_root(env) / "output/data/run"
    run_id = flag_value(script_args, "--run-id") or env.get("RUN_ID")
    fsx = env.get("FSX_MOUNT")
    return Path(fsx) / "runs" / run_id if fsx and run_id else None


def flight_recorder(run: Path | None) -> dict[str, str]:
    """NCCL's Flight Recorder on, dumping into the run's folder on NCCL's collective timeout (gloo ignores these).
    The file prefix under both of its names: TORCH_FR_DUMP_TEMP_FILE, and TORCH_NCCL_DEBUG_INFO_TEMP_FILE before it."""
    if run is None:
        return {}
    folder = run / HANG_FOLDER / "flight-recorder"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return {}  # not writable here: NCCL then keeps its own default (/tmp), and the training goes on
    prefix = str(folder / "rank_")
    return {"TORCH_NCCL_TRACE_BUFFER_SIZE": TRACE_BUFFER_ENTRIES, "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_FR_DUMP_TEMP_FILE": prefix, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix}  # fmt: skip


def environ(pid: int) -> dict[str, str]:
    """A process's environment as it started (Linux /proc, as in every image of the platform); {} once it is gone."""
    found: dict[str, str] = {}
    try:
        for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            name, _, value = item.decode(errors="replace").partition("=")
            found[name] = value
    except OSError:
        pass
    return found


def describe(pid: int) -> dict:
    """A worker as the summary names it: rank, local rank, process state (R, S, D, T...), pid, host."""
    env = environ(pid)
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        state = "gone"
    rank = env.get("RANK")
    return {"rank": int(rank) if rank and rank.isdigit() else None, "local_rank": env.get("LOCAL_RANK"),
            "node": env.get("GROUP_RANK"), "state": state, "pid": pid, "host": socket.gethostname()}  # fmt: skip


def in_collective(stacks: str) -> bool:
    return bool(COLLECTIVE_FRAME.search(stacks))


def stopped_first(workers: list[dict]) -> dict | None:
    """The worker the others wait for, with why; None when the stacks do not single one out."""
    stopped = [w for w in workers if w["state"] == "T"]
    if stopped:
        return {**_who(stopped[0]), "why": "held stopped by the kernel (process state T) while the others waited"}
    waiting = [w for w in workers if in_collective(w.get("stacks", ""))]
    outside = [w for w in workers if w.get("stacks") and not in_collective(w["stacks"])]
    if waiting and outside:
        return {**_who(outside[0]), "why": f"outside any collective while {len(waiting)} rank(s) waited in one"}
    # DDP waits for its gradients inside backward, in C++ (no torch.distributed frame): there the one rank still
    # running (state R) outside any collective while every other sleeps is the one spinning in its own code. Its
    # host is not blamed (host_fault): a loop is the code's, and on GPUs a rank waiting for its device may spin too.
    running = [w for w in outside if w["state"] == "R"]
    if len(running) == 1 and len(workers) > 1 and all(w["state"] == "S" for w in workers if w is not running[0]):
        why = f"running (process state R) outside any collective while {len(workers) - 1} rank(s) slept"
        return {**_who(running[0]), "why": why, "host_fault": False}
    return None


def _who(worker: dict) -> dict:
    return {"rank": worker["rank"], "node": worker.get("node"), "host": worker["host"], "pid": worker["pid"]}


def attempt_folder(run: Path | None) -> Path | None:
    """This attempt's evidence folder under the run's hang folder (timestamped); None where there is no run folder."""
    return None if run is None else run / HANG_FOLDER / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def keep(
    folder: Path | None,
    summary: dict | None,
    workers: list[dict],
    node: str | None = None,
    identity: dict | None = None,
) -> Path | None:
    """Each worker's stacks in `folder`, and the summary (main node) or `node-<node>.json` (another node: its workers
    and its host's identity, runtime/bad_hosts.host_identity, so that the main node can name it bad)."""
    if folder is None:
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for worker in workers:
            name = f"stacks-rank{worker['rank'] if worker['rank'] is not None else 'pid' + str(worker['pid'])}.txt"
            (folder / name).write_text(worker.get("stacks", ""))
        described = [{key: value for key, value in w.items() if key != "stacks"} for w in workers]
        node_file = {"identity": identity, "workers": described}
        name, content = ("summary.json", summary) if summary is not None else (f"node-{node}.json", node_file)
        (folder / name).write_text(json.dumps(content, indent=1, sort_keys=True, default=str))
    except OSError:
        return None  # evidence is worth keeping, never worth failing the ending of a hung attempt over
    return folder


def ask_peers(run: Path | None, folder: Path | None) -> None:
    """The main node's request to the other nodes: their stacks into `folder` (best effort)."""
    if run is None or folder is None:
        return
    try:
        (run / HANG_FOLDER).mkdir(parents=True, exist_ok=True)
        (run / HANG_FOLDER / REQUEST).write_text(json.dumps({"folder": str(folder)}))
    except OSError:
        pass


def asked(run: Path | None, since: float) -> Path | None:
    """The folder the main node asked for stacks in, if it asked after `since` (epoch seconds)."""
    request = None if run is None else run / HANG_FOLDER / REQUEST
    try:
        if request is None or request.stat().st_mtime < since:
            return None
        return Path(json.loads(request.read_text())["folder"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def peers_stacks(folder: Path | None, nodes: int, wait: float = PEER_WAIT_SECONDS) -> list[dict]:
    """The other nodes' workers (their `node-<N>.json`, stacks read back), once `nodes` of them wrote or `wait` ran
    out."""
    if folder is None or nodes <= 0:
        return []
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and len(list(folder.glob("node-*.json"))) < nodes:
        time.sleep(0.2)
    workers: list[dict] = []
    for described in sorted(folder.glob("node-*.json")):
        try:
            node = json.loads(described.read_text())
            for worker in node["workers"]:
                stacks = folder / f"stacks-rank{worker['rank']}.txt"
                text = stacks.read_text() if stacks.exists() else ""
                workers.append({**worker, "stacks": text, "identity": node.get("identity")})
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return workers

"""Run the training pipeline's stages on CPU with the container's entry points, then report and plot.

    python training_image/local_run.py --out local-run

Steps (each through launch.py, as in the container): make a small corpus and shards
(prepare-data), sanity check (2 processes, gloo), train a tiny GPT (2 processes, DDP),
validate an early checkpoint to create a baseline, validate the final checkpoint against
it (validate.py's 0.1% tolerance, the pipeline's), print a report and save loss / tokens-per-second curves as a PNG,
then one verdict line (exit 0 approved, 1 rejected). No AWS: the deployed pipeline (a Step
Functions state machine) runs the same stages as Batch or EKS jobs.
With --model ctr-tiny the same stages run the sparse click-through model instead: Criteo-format logs from the
generator (efa_training/workloads/ctr_ps/sample.py), prepare-data --format criteo, training on 2 parameter servers and
--nproc workers (efa_training/workloads/ctr_ps/), and validation by log-loss (against the base rate's) and AUC.
Owns only these paths under --out: corpus/, data/, checkpoints/, mlflow.db and the files OWNED names.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the package beside this file (run by path: `python training_image/local_run.py`)

import numpy as np  # noqa: E402

from efa_training.runtime.metrics import parse_emf_lines  # noqa: E402
from efa_training.workloads.ctr_ps.evaluate import METRIC as SPARSE_METRIC  # noqa: E402
from efa_training.workloads.ctr_ps.evaluate import base_rate_log_loss  # noqa: E402
from efa_training.workloads.ctr_ps.sample import generate  # noqa: E402
from efa_training.workloads.gpt.sample import write_corpus  # noqa: E402

# What each demo's final model is judged against, with validate.py's default tolerance (0.1%, the pipeline's).
GPT_BASELINE = "the same run's checkpoint at a third of its steps"
SPARSE_BASELINE = "the base rate: the training split's click rate predicted for every holdout record"
# The files a run writes under --out, by name (besides corpus/, data/, checkpoints/ and mlflow.db): a fresh run removes
# these and nothing else, so an --out that holds other files (even `--out .`) loses none of them.
STAGES = ("prepare_data", "sanity", "train", "baseline", "validate")
OWNED = (
    "report.json",
    "sanity.json",
    "baseline.json",
    "verdict.json",
    "training_curves.png",
    *(f"{s}.log" for s in STAGES),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_stage(
    name: str, args: list[str], out: Path, env: dict, cwd: Path | None = None
) -> tuple[subprocess.CompletedProcess, float]:
    """One stage through launch.py (in `cwd`: a declared workload's folder); its output in <name>.log; a failure ends
    the run with the log's tail."""
    print(f"[local_run] {name}: launch.py {' '.join(args)}", flush=True)
    t0 = time.perf_counter()
    env = {**env, "MASTER_PORT": str(free_port())}
    launch = [sys.executable, str(HERE / "launch.py"), *args]
    proc = subprocess.run(launch, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    (out / f"{name}.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise SystemExit(
            f"[local_run] {name} failed with exit code {proc.returncode} (full log: {out / (name + '.log')}):\n{tail}"
        )
    print(f"[local_run] {name}: ok in {elapsed:.1f}s", flush=True)
    return proc, elapsed


def plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display in CI or containers
    import matplotlib.pyplot as plt

    steps = [r["Step"] for r in records]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    ax1.plot(steps, [r["Loss"] for r in records])
    ax1.set_ylabel("Loss (cross-entropy)")
    ax1.set_title("local run: tiny GPT, 2 CPU processes, DDP")
    ax2.plot(steps, [r["TokensPerSecond"] for r in records], color="tab:green")
    ax2.set_ylabel("TokensPerSecond")
    ax2.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output directory (created; its owned sub-paths are replaced)")
    p.add_argument("--steps", type=int, default=300, help="training steps (default %(default)s)")
    p.add_argument("--nproc", type=int, default=2, help="processes for sanity check and training (default 2)")
    p.add_argument(
        "--model",
        default="tiny",
        help="a GPT size (tiny, mini, ...: on a text corpus, DDP) or a ctr-* size (a click-through model on "
        "generated Criteo logs, parameter servers: 2 servers and --nproc workers) (default tiny)",
    )
    p.add_argument("--strategy", default="ddp", help="a GPT's: ddp or fsdp (default ddp)")
    p.add_argument("--tensor-parallel", type=int, default=1, help="a GPT's, with fsdp: the degree (default 1)")
    p.add_argument("--pipeline-parallel", type=int, default=1, help="a GPT's, with fsdp: the stages (default 1)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = Path(args.out).resolve()
    if out.exists() and not out.is_dir():
        print(f"local_run.py: error: --out={args.out!r}: is a file; allowed: a directory", file=sys.stderr)
        return 2
    clear(out)
    out.mkdir(parents=True, exist_ok=True)
    tracking = prepare_store(tracking_uri(out))
    print(f"[local_run] tracking: {tracking}", flush=True)
    t_start = time.perf_counter()
    if args.model.startswith("ctr-"):
        train = run_sparse_stages(out, local_env(args.nproc, out), args.steps, args.model)
        report = summarize_sparse(out, train.stdout, t_start)
    else:
        layout = [
            *("--strategy", args.strategy, "--tensor-parallel", str(args.tensor_parallel)),
            *("--pipeline-parallel", str(args.pipeline_parallel)),
        ]
        train = run_stages(out, local_env(args.nproc, out), args.steps, args.model, layout)
        report = summarize(out, train.stdout, t_start)
    report["tracking"] = tracking
    report["validate"]["baseline_from"] = SPARSE_BASELINE if args.model.startswith("ctr-") else GPT_BASELINE
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2), flush=True)
    passed = report["sanity"]["passed"] and report["validate"]["passed"]
    print(verdict_line(report), flush=True)
    return 0 if passed else 1


def clear(out: Path) -> None:
    """What an earlier run left under --out: a fresh run, not a resume of the last one, and no stale file beside it."""
    (out / "mlflow.db").unlink(missing_ok=True)  # the run's own MLflow store, as its checkpoints are
    for owned in ("corpus", "data", "checkpoints"):
        shutil.rmtree(out / owned, ignore_errors=True)
    for name in OWNED:
        (out / name).unlink(missing_ok=True)


def verdict_line(report: dict) -> str:
    """The run's outcome in one line, the last it prints: approved, or why not and that it exits 1."""
    v = report["validate"]
    if not report["sanity"]["passed"]:
        return "[local_run] rejected: the sanity check failed (sanity.json); exit 1"
    value = "diverged (not a number)" if v["value"] is None else f"{v['value']:.4f}"
    auc = f", AUC {v['auc']:.3f}" if v.get("auc") is not None else ""
    limit = f"{v['baseline']:.4f} + {v['tolerance']:.1%}" if v["baseline"] is not None else "no baseline"
    rule = f"{v['metric']} {value} against {limit} ({v['baseline_from']}){auc}"
    return f"[local_run] approved: {rule}" if v["passed"] else f"[local_run] rejected: {rule}; exit 1"


def tracking_uri(out: Path) -> str:
    """A local run's MLflow store: SQLite beside its output (MLflow's default backend; `make tracking-ui` opens it)."""
    return f"sqlite:///{out / 'mlflow.db'}"


def prepare_store(uri: str) -> str:
    """The run's MLflow store created once, before the first stage, and waited for: each stage's process would
    otherwise create its schema itself, and one that exits while another creates it leaves it half made (later
    stages fail "table ... already exists" and track nothing). What happened, in one line for the run's report."""
    try:
        from mlflow.tracking import MlflowClient  # the local tracking client (mlflow-skinny); not in the images

        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)  # creates the schema, synchronously
    except Exception as error:  # noqa: BLE001 - MLflow missing or its store refused: the run goes on untracked
        return f"not tracked: the store {uri} could not be created ({type(error).__name__}: {str(error)[:160]})"
    return f"tracked to {uri}"


def local_env(nproc: int, out: Path | None = None) -> dict:
    env = {
        **({"MLFLOW_TRACKING_URI": tracking_uri(out)} if out is not None else {}),
        **os.environ,
        "ACCELERATOR_KIND": "cpu",
        "ACCELERATORS_PER_NODE": str(nproc),
        "RUN_ID": os.environ.get("RUN_ID", "local-run"),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    # A local run must not pick up a scheduler's variables, nor a WORKLOAD that is not a declaration: `make local-run
    # WORKLOAD=gpt` puts the name in the environment (make exports command-line variables), and the launcher reads
    # WORKLOAD as a declared workload's JSON (runtime/user_workload.py).
    scheduler = ("MASTER_ADDR", "WORLD_SIZE", "RANK", "WORKLOAD")
    for var in [k for k in env if k.startswith(("AWS_BATCH_", "PET_")) or k in scheduler]:
        env.pop(var)
    return env


def unregistered(env: dict) -> dict:
    """The baseline stage's environment: tracked nowhere, so it registers nothing. It validates an early checkpoint
    against nothing (it passes by definition, as the baseline's maker), and MLflow's registry takes one version per run
    (runtime/registered_model.py): registered, it would stand for the run in place of the model the final validation
    approves, and for a run whose final validation rejects its model."""
    return {k: v for k, v in env.items() if k != "MLFLOW_TRACKING_URI"}


def run_stages(
    out: Path, env: dict, steps: int, model: str = "tiny", layout: list[str] | None = None
) -> subprocess.CompletedProcess:
    """prepare-data, sanity, train, a baseline from an early checkpoint, validation; the training stage's output.
    `layout`: train.py's --strategy, --tensor-parallel and --pipeline-parallel flags (DDP by default)."""
    ckpt, data = out / "checkpoints", out / "data"
    every = max(1, steps // 3)
    write_corpus(out / "corpus", documents=8, sentences=600)
    prepare = ["prepare-data", "--input", str(out / "corpus"), "--output", str(data)]
    run_stage("prepare_data", [*prepare, "--val-fraction", "0.1"], out, env)
    run_stage("sanity", ["sanity", "--sizes", "64K,1M", "--report", str(out / "sanity.json")], out, env)
    where = ["--data", str(data), "--checkpoint-dir", str(ckpt)]
    flags = [
        "--max-steps",
        str(steps),
        "--checkpoint-every",
        str(every),
        "--model",
        model,
        "--lr",
        "3e-3",
        *(layout or []),
    ]
    train, _ = run_stage("train", ["train", *where, *flags, "--warmup-steps", "20", "--seed", "1"], out, env)
    for stale in ("baseline.json", "verdict.json"):
        (out / stale).unlink(missing_ok=True)
    early, baseline = ["--checkpoint", str(ckpt / f"step_{every:09d}")], ["--baseline", str(out / "baseline.json")]
    run_stage("baseline", ["validate", *early, "--data", str(data), *baseline], out, unregistered(env))
    final = ["--checkpoint", str(ckpt), "--data", str(data), *baseline, "--verdict", str(out / "verdict.json")]
    run_stage("validate", ["validate", *final], out, env)
    return train


def run_sparse_stages(out: Path, env: dict, steps: int, model: str) -> subprocess.CompletedProcess:
    """The same stages for the sparse model: generated Criteo logs, prepare-data --format criteo, sanity, training on
    2 parameter servers and the workers, validation (log-loss and AUC) against the base rate's log-loss. Not against an
    early checkpoint, as the GPT's: asynchronous workers make two runs differ, and this small model is near its best
    after a third of its steps, so "no worse than step 100 within 0.1%" failed about one run in two here."""
    ckpt, data = out / "checkpoints", out / "data"
    every = max(1, steps // 3)
    (out / "corpus").mkdir(parents=True, exist_ok=True)
    generate(out / "corpus" / "day_0.txt", rows=40_000, seed=1)
    prepare = ["prepare-data", "--format", "criteo", "--input", str(out / "corpus"), "--output", str(data)]
    run_stage("prepare_data", [*prepare, "--val-fraction", "0.1"], out, env)
    run_stage("sanity", ["sanity", "--sizes", "64K,1M", "--report", str(out / "sanity.json")], out, env)
    flags = ["--strategy", "ps", "--model", model, "--ps-servers-per-node", "2", "--batch-size", "128", "--lr", "0.02"]
    where = ["--data", str(data), "--checkpoint-dir", str(ckpt), "--max-steps", str(steps)]
    train, _ = run_stage("train", ["train", *where, *flags, "--checkpoint-every", str(every)], out, env)
    (out / "verdict.json").unlink(missing_ok=True)
    base = {"metric": SPARSE_METRIC, "value": base_rate_log_loss(data), "source": SPARSE_BASELINE}
    (out / "baseline.json").write_text(json.dumps(base) + "\n")
    final = [
        "--checkpoint",
        str(ckpt),
        "--baseline",
        str(out / "baseline.json"),
        "--verdict",
        str(out / "verdict.json"),
    ]
    run_stage("validate", ["validate", *final, "--data", str(data)], out, env)
    return train


def summarize_sparse(out: Path, train_stdout: str, t_start: float) -> dict:
    records = parse_emf_lines(train_stdout.splitlines())
    workers = [
        json.loads(line)["ps_worker_summary"] for line in train_stdout.splitlines() if "ps_worker_summary" in line
    ]
    plot_sparse(records, out / "training_curves.png")
    sanity = json.loads((out / "sanity.json").read_text())
    verdict = json.loads((out / "verdict.json").read_text())
    return {
        "sanity": {"passed": sanity["passed"], "all_reduce_busbw_gbps": round(sanity["measured_busbw_gbps"], 4)},
        "train": {
            "workers": len(workers),
            "steps_per_worker": max(w["steps"] for w in workers),
            "first_loss": round(records[0]["Loss"], 4),
            "final_loss": round(float(np.mean([r["Loss"] for r in records[-20:]])), 4),
            "samples_per_second": round(sum(w["samples_per_second"] or 0.0 for w in workers), 1),
        },
        "validate": {
            k: verdict[k] for k in ("metric", "value", "auc", "baseline", "relative_delta", "tolerance", "passed")
        },
        "artifacts": {"plot": str(out / "training_curves.png"), "verdict": str(out / "verdict.json"), "logs": str(out)},
        "wall_seconds": round(time.perf_counter() - t_start, 1),
    }


def plot_sparse(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for worker in sorted({r["Worker"] for r in records}):
        mine = [r for r in records if r["Worker"] == worker]
        steps = [r["Step"] for r in mine]
        ax1.plot(steps, [r["Loss"] for r in mine], label=f"worker {worker}", alpha=0.7)
        ax2.plot(steps, [r["SamplesPerSecond"] for r in mine], label=f"worker {worker}", alpha=0.7)
    ax1.set_ylabel("Loss (log-loss of the batch)")
    ax1.set_title("local run: ctr-tiny, 2 parameter servers, asynchronous workers")
    ax1.legend()
    ax2.set_ylabel("SamplesPerSecond")
    ax2.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summarize(out: Path, train_stdout: str, t_start: float) -> dict:
    """The report of a finished run, and its loss and throughput curves as a PNG."""
    records = parse_emf_lines(train_stdout.splitlines())
    plot(records, out / "training_curves.png")
    summary = [json.loads(line)["summary"] for line in train_stdout.splitlines() if line.startswith('{"summary"')][-1]
    sanity = json.loads((out / "sanity.json").read_text())
    verdict = json.loads((out / "verdict.json").read_text())
    return {
        "sanity": {"passed": sanity["passed"], "all_reduce_busbw_gbps": round(sanity["measured_busbw_gbps"], 4)},
        "train": {
            "steps": summary["steps"],
            "first_loss": round(records[0]["Loss"], 4),
            "final_loss": round(summary["final_loss"], 4),
            "mean_tokens_per_second": round(summary["mean_tokens_per_second"] or 0.0, 1),
        },
        "validate": {k: verdict[k] for k in ("metric", "value", "baseline", "relative_delta", "tolerance", "passed")},
        "artifacts": {
            "plot": str(out / "training_curves.png"),
            "verdict": str(out / "verdict.json"),
            "sanity_report": str(out / "sanity.json"),
            "logs": str(out),
        },
        "wall_seconds": round(time.perf_counter() - t_start, 1),
    }


if __name__ == "__main__":
    sys.exit(main())

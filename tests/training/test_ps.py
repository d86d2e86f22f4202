"""The parameter-server strategy on CPU with real processes: 2 servers and 2 workers (workloads/ctr_ps/).

The data is the generator's (sample.generate), whose labels follow a known logistic model: its own log-loss and
AUC on the holdout are the best any model can reach, so quality is measured against a known ceiling.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.training import training_helpers as th

pytestmark = pytest.mark.slow  # real torchrun processes

SEED, ROWS, CARDINALITY = 5, 40_000, 100
# The generator's own model reaches AUC 0.79 on this holdout and a constant guess 0.5; four runs of this job reached
# 0.737-0.758 (updates arrive in a different order each run).
AUC_THRESHOLD = 0.72
BATCH, STEPS = 128, 300  # 2 workers x 300 x 128: about two passes over the 36,000 training records


@pytest.fixture(scope="session")
def ctr_data_dir(tmp_path_factory) -> Path:
    def build(root: Path) -> Path:
        from efa_training import prepare_data
        from efa_training.workloads.ctr_ps import sample

        sample.generate(root / "day_0.txt", ROWS, seed=SEED, cardinality=CARDINALITY)
        args = ["--format", "criteo", "--input", str(root / "day_0.txt"), "--output", str(root / "data")]
        assert prepare_data.main([*args, "--val-fraction", "0.1"]) == 0
        return root / "data"

    return th.shared(tmp_path_factory, "ctr_data", build)


def ps_args(data: Path, ckpt: Path, steps: int = STEPS, **flags: object) -> list[str]:
    args = ["--strategy", "ps", "--model", "ctr-tiny", "--data", str(data), "--checkpoint-dir", str(ckpt)]
    args += ["--max-steps", str(steps), "--batch-size", str(BATCH), "--lr", "0.02", "--ps-servers-per-node", "2"]
    args += ["--log-every", "1", "--checkpoint-every", "50"]
    for name, value in flags.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    return args


class PsJob:
    """train.py --strategy ps in its own session: the supervisor, 2 servers and 2 workers on this machine."""

    def __init__(self, args: list[str], workdir: Path, **env_extra: str) -> None:
        self.out, self.err = workdir / "stdout.txt", workdir / "stderr.txt"
        env = th.env(PS_REGISTRY=f"127.0.0.1:{th.free_port()}", PS_WORKERS_PER_NODE="2", **env_extra)
        with open(self.out, "w") as stdout, open(self.err, "w") as stderr:
            self.proc = subprocess.Popen(
                [th.PYTHON, *th.script_args("train.py"), *args],
                env=env,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
            )

    def log(self) -> str:
        return self.err.read_text()

    def pid(self, role: str, index: int) -> int:
        """The newest process the supervisor started for this role and index."""
        found = re.findall(rf"ps: {role} {index} started \(pid (\d+)", self.log())
        assert found, self.log()[-2000:]
        return int(found[-1])

    def steps_of(self, worker: int) -> list[dict]:
        # The job is still writing: its last line may be half there (seen once in CI), so only whole lines count.
        text = self.out.read_text()
        whole = text[: text.rfind("\n") + 1]
        return [r for r in th.Run(0, whole, "").emf() if r.get("Worker") == worker]

    def wait_for(self, predicate, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.proc.poll() is not None:
                raise AssertionError(f"the job ended early ({self.proc.returncode}): {self.log()[-3000:]}")
            if time.monotonic() > deadline:
                os.killpg(self.proc.pid, signal.SIGKILL)
                raise AssertionError(f"timed out: {self.log()[-3000:]}")
            time.sleep(0.05)

    def finish(self, timeout: float = 240) -> th.Run:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            last = {w: [r["Step"] for r in self.steps_of(w)][-3:] for w in (0, 1)}
            raise AssertionError(f"the job hung; last steps {last}; log: {self.log()[-3000:]}") from None
        return th.Run(self.proc.returncode, self.out.read_text(), self.err.read_text())


def run_ps(args: list[str], workdir: Path, **env_extra: str) -> th.Run:
    workdir.mkdir(parents=True, exist_ok=True)
    return PsJob(args, workdir, **env_extra).finish()


def validate(ckpt: Path, data: Path) -> dict:
    run = th.single_process("validate.py", ["--checkpoint", str(ckpt), "--data", str(data), "--baseline", "0.6"])
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])["verdict"]


def final_positions(ckpt: Path) -> list[int]:
    newest = sorted(ckpt.glob("step_*"))[-1]
    return torch.load(newest / "dense.pt", weights_only=True)["positions"]


@pytest.fixture(scope="session")
def ps_reference(ctr_data_dir, tmp_path_factory) -> th.Run:
    """One uninterrupted job: 2 servers, 2 workers, the default staleness bound."""

    def build(root: Path) -> th.Run:
        run = run_ps(ps_args(ctr_data_dir, root / "ckpt"), root)
        assert run.returncode == 0, run.stderr[-3000:]
        run.checkpoint_dir = root / "ckpt"
        return run

    return th.shared(tmp_path_factory, "ps_reference", build)


def test_generated_data_has_a_known_ceiling(ctr_data_dir):
    from efa_training.workloads.ctr_ps import criteo, evaluate, sample

    records = criteo.CtrRecords(ctr_data_dir, "val")
    holdout = records.take(np.arange(records.n))
    best = sample.true_logit(holdout, SEED, CARDINALITY)
    assert 0.75 < evaluate.auc(holdout["label"], best) < 0.85
    assert 0.15 < holdout["label"].mean() < 0.4  # about a quarter clicks, as in Criteo's logs


def test_ps_loss_falls_and_auc_beats_the_threshold(ps_reference, ctr_data_dir):
    losses = [r["Loss"] for r in ps_reference.emf()]
    assert np.mean(losses[-40:]) < np.mean(losses[:40]) - 0.03
    verdict = validate(ps_reference.checkpoint_dir, ctr_data_dir)
    assert verdict["metric"] == "val_logloss"
    assert verdict["auc"] > AUC_THRESHOLD, verdict
    assert verdict["step"] == STEPS


def test_ps_every_worker_consumes_exactly_its_share(ps_reference):
    assert final_positions(ps_reference.checkpoint_dir) == [STEPS * BATCH, STEPS * BATCH]


def test_ps_metrics_lines_carry_latencies_staleness_and_rows(ps_reference):
    line = ps_reference.emf()[-1]
    names = {m["Name"] for m in line["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert {"PullLatencyMs", "PushLatencyMs", "StalenessSteps", "RowsTouched", "SamplesPerSecond", "Loss"} <= names
    assert 0 < line["RowsTouched"] <= BATCH * 26


def largest_lead(run: th.Run) -> int:
    """How far worker 0's steps ran ahead of worker 1's, read from the workers' own step lines (not the servers'
    accounting): at each of worker 0's lines, its step minus worker 1's newest step logged by then (once worker 1
    has logged one; until a worker says hello no server counts it)."""
    lines = sorted(run.emf(), key=lambda r: r["_aws"]["Timestamp"])
    newest, lead = 0, 0
    for line in lines:
        if line["Worker"] == 1:
            newest = max(newest, line["Step"])
        elif newest:
            lead = max(lead, line["Step"] - newest)
    return lead


def straggler_run(data: Path, workdir: Path, bound: int) -> th.Run:
    """24 steps with worker 1 at a third of worker 0's speed and the given staleness bound."""
    run = run_ps(ps_args(data, workdir / "ckpt", steps=24, staleness=bound), workdir, PS_SLOW_WORKER="1:3")
    assert run.returncode == 0, run.stderr[-3000:]
    return run


@pytest.mark.parametrize("bound", [0, 2])
def test_ps_staleness_bound_holds_a_fast_worker_to_a_straggler(ctr_data_dir, tmp_path, bound):
    # A pull of step s is answered once the slowest worker's next push is at least s - bound (ps.py,
    # Server.within_staleness): the fast worker reaches the bound and waits there. Worker 0 logs step s after
    # pushing it and worker 1 logs each step after sending its push, so the lead the step lines show is at most
    # bound + 1.
    run = straggler_run(ctr_data_dir, tmp_path, bound)
    assert max(r["StalenessSteps"] for r in run.emf()) == bound  # reached, not only respected
    assert largest_lead(run) <= bound + 1, largest_lead(run)


def test_ps_without_a_bound_the_same_measurement_shows_the_fast_worker_running_ahead(ctr_data_dir, tmp_path):
    # The measurement above can see a missing bound: with none (-1), worker 0 finishes while worker 1 is at a third.
    assert largest_lead(straggler_run(ctr_data_dir, tmp_path, -1)) > 2 * (2 + 1), "no lead without a bound"


def test_ps_worker_killed_is_replaced_while_the_other_goes_on(ctr_data_dir, tmp_path):
    job = PsJob(ps_args(ctr_data_dir, tmp_path / "ckpt"), tmp_path)
    job.wait_for(lambda: len(job.steps_of(1)) >= 30)
    os.kill(job.pid("worker", 1), signal.SIGKILL)
    killed_at = time.time()
    job.wait_for(lambda: "worker 1 rejoins" in job.log())
    rejoined_at = time.time()
    run = job.finish()
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ps: worker 1 failed (exit -9); replacing it (1/3)" in run.stderr
    # Worker 0 went on while worker 1 was gone: the servers, told of the death, stop holding it to the dead worker's
    # clock. Counted from worker 0's own step lines between the kill and the replacement's joining (held to the
    # dead worker's clock it could make at most the staleness bound, 4; a mutant whose servers were never told made
    # 5 here, the real code 265).
    during = [r for r in job.steps_of(0) if killed_at < r["_aws"]["Timestamp"] / 1000 < rejoined_at]
    assert len(during) >= 20, len(during)
    assert final_positions(tmp_path / "ckpt") == [STEPS * BATCH, STEPS * BATCH]


def test_ps_server_killed_resumes_every_process_from_the_last_checkpoint(ctr_data_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    job = PsJob(ps_args(ctr_data_dir, ckpt), tmp_path)
    job.wait_for(lambda: (ckpt / "step_000000100").is_dir())
    os.kill(job.pid("server", 1), signal.SIGKILL)
    run = job.finish()
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ps: server 1 failed (exit -9); every process restarts from the last checkpoint (1/3)" in run.stderr
    assert re.search(r"ps: resumed from \S+step_000000[12]\d0 at step", run.stderr), run.stderr[-3000:]
    # Nothing lost: every worker ends with exactly its share of the data, and the model is as good.
    assert final_positions(ckpt) == [STEPS * BATCH, STEPS * BATCH]
    assert validate(ckpt, ctr_data_dir)["auc"] > AUC_THRESHOLD


def test_ps_refuses_a_checkpoint_of_another_server_count(ps_reference, ctr_data_dir, tmp_path):
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(ps_reference.checkpoint_dir, ckpt)
    args = ps_args(ctr_data_dir, ckpt, steps=STEPS + 10)
    args[args.index("--ps-servers-per-node") + 1] = "1"
    run = run_ps(args, tmp_path)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "written by 2 servers and 2 workers, this job has 1 and 2" in run.stderr


def test_ps_starts_from_another_runs_model_resharded_to_its_own_servers(ps_reference, ctr_data_dir, tmp_path):
    # Incremental training: the reference run's rows and dense weights, spread over 1 server instead of 2.
    args = ps_args(ctr_data_dir, tmp_path / "ckpt", steps=20, init_from=ps_reference.checkpoint_dir)
    args[args.index("--ps-servers-per-node") + 1] = "1"
    run = run_ps(args, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"ps: starting from the weights of {ps_reference.checkpoint_dir}/step_{STEPS:09d}" in run.stderr
    fresh_first = np.mean([r["Loss"] for r in ps_reference.emf() if r["Step"] <= 3])
    warm_first = np.mean([r["Loss"] for r in run.emf() if r["Step"] <= 3])
    reference_last = np.mean([r["Loss"] for r in ps_reference.emf()[-40:]])
    # At the reference's final loss or below it (its first batches are ones the initial model trained on twice).
    assert warm_first < fresh_first - 0.05 and warm_first < reference_last + 0.06


def test_ps_sigterm_cuts_a_checkpoint_past_every_worker_and_resumes_from_it(ctr_data_dir, tmp_path):
    # Spot or a terminated job: the supervisor asks for a cut at the first step no worker reached (Batch's default
    # grace is 30 s: job_timeouts.html), waits for it, and stops with 143; the next attempt resumes.
    ckpt = tmp_path / "ckpt"
    job = PsJob(ps_args(ctr_data_dir, ckpt), tmp_path)
    job.wait_for(lambda: len(job.steps_of(0)) >= 70)
    reached = max(len(job.steps_of(0)), len(job.steps_of(1)))  # steps finished before the signal
    job.proc.send_signal(signal.SIGTERM)
    run = job.finish()
    assert run.returncode == 143, run.stderr[-3000:]
    found = re.search(r"ps: stopped after checkpoint (\d+)", run.stderr)
    assert found, run.stderr[-3000:]
    stopped = int(found.group(1))
    assert stopped >= reached  # past every step taken before the signal
    assert (ckpt / f"step_{stopped:09d}" / "meta.json").is_file()
    # Nothing moved past the stop's cut while the supervisor ended the processes (found in CI under load: pushes
    # went on to the next regular cut, so the next attempt resumed past the cut the stop reported).
    assert max(int(p.name.split("_")[1]) for p in ckpt.glob("step_*")) == stopped
    again = run_ps(ps_args(ctr_data_dir, ckpt), tmp_path / "again")
    assert again.returncode == 0 and f"resumed from {ckpt}/step_{stopped:09d}" in again.stderr, again.stderr[-2000:]
    assert final_positions(ckpt) == [STEPS * BATCH, STEPS * BATCH]


def test_ps_a_finished_run_started_again_ends_at_once(ps_reference, ctr_data_dir, tmp_path):
    # A retried or repeated submission of a run that already reached its last step: nothing to train, exit 0.
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(ps_reference.checkpoint_dir, ckpt)
    run = run_ps(ps_args(ctr_data_dir, ckpt), tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"resumed from {ckpt}/step_{STEPS:09d} at step {STEPS}" in run.stderr
    assert [
        json.loads(line)["ps_worker_summary"]["steps"] for line in run.stdout.splitlines() if "summary" in line
    ] == [
        0,
        0,
    ]


def test_ps_a_second_job_on_the_same_checkpoint_folder_is_refused(ctr_data_dir, tmp_path):
    # One writer per folder, as for ddp/fsdp: a copy of the same job must not write cuts beside the first.
    from efa_training.checkpointing.lock import lock_folder

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    held = lock_folder(ckpt, {"host": "elsewhere", "pid": 1, "run_id": "another-run"})
    assert not isinstance(held, str)
    run = run_ps(ps_args(ctr_data_dir, ckpt, steps=20), tmp_path / "second")
    held.close()
    assert run.returncode == 5, run.stderr[-2000:]
    assert "is in use by another job" in run.stderr and not list(ckpt.glob("step_*"))


# A non-finite loss stops the job (exit 4), and first reports NonFiniteLoss on its step, whether or not the step is
# one that logs: the NonFiniteLoss alarm watches that line.
def test_ps_a_nan_loss_is_reported_before_the_worker_stops():
    import io
    from types import SimpleNamespace

    from efa_training.runtime.errors import EXIT_DIVERGED, RunRefused
    from efa_training.runtime.metrics import MetricsLogger
    from efa_training.workloads.ctr_ps.worker import Worker

    class Diverged(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, dense: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
            return (dense.sum(1) + embedded.sum(1)) * self.w * float("nan")

    stream, model = io.StringIO(), Diverged()
    worker = SimpleNamespace(model=model, device="cpu", layout=SimpleNamespace(index=1),
                             metrics=MetricsLogger("r", enabled=True, stream=stream, environ={}))  # fmt: skip
    batch = np.zeros(4, dtype=[("dense", np.float32, (3,)), ("label", np.float32)])
    embedded = torch.zeros(2, 5, requires_grad=True)
    with pytest.raises(RunRefused) as refused:
        Worker._forward_backward(worker, batch, embedded, torch.tensor([0, 1, 0, 1]), model.state_dict(), 6)  # type: ignore[arg-type]
    assert refused.value.code == EXIT_DIVERGED
    (line,) = [json.loads(text) for text in stream.getvalue().splitlines()]
    assert line["NonFiniteLoss"] == 1 and line["Step"] == 7 and line["Worker"] == 1

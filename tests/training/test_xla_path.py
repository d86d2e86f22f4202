"""train.py's XLA path (the Trainium path) executed on PyTorch/XLA's CPU device, and checkpoints that move between
the XLA and the CPU/CUDA paths.

The XLA environment (.venv-xla, requirements-xla.txt: the Neuron image's PyTorch 2.9 line) runs train.py through
tests/training/xla_run.py, which records the XLA calls; `make test` creates it. One process: on the CPU device the XLA
backend's collectives do not reduce across processes (seen here: in a 2-process run each rank's all_reduce returned
its own values, the replicas drifted apart and the checkpoint barrier did not hold), so the multi-process behaviour
is tested on the CPU/gloo path (tests/training/) and runs on Trainium through Neuron's collectives.
"""

import json
import subprocess
from pathlib import Path

import pytest
import torch

from tests.training import training_helpers as th

ROOT = Path(__file__).resolve().parents[2]
XLA_PYTHON = ROOT / ".venv-xla" / "bin" / "python"
RUNNER = Path(__file__).resolve().parent / "xla_run.py"
STEPS, WARM_UP_STEPS, CHECKPOINT_EVERY = 12, 3, 6
ACCUMULATING_STEPS = 2  # the gradient-accumulation run: its second step is the first with the optimizer's state
# All XLA runs on one xdist worker: each is a few CPU-heavy processes.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("xla")]


def _require_xla_environment() -> None:
    if not XLA_PYTHON.exists():
        pytest.fail(f"{XLA_PYTHON} is missing: `make test` creates it from requirements-xla.txt")


def xla_train(out_dir: Path, data: Path, ckpt: Path, steps: int = STEPS, grad_accum: int = 1, **env: str) -> dict:
    """train.py on the XLA CPU device (one process), its record from xla_run.py, and its stdout lines."""
    _require_xla_environment()
    record_path = out_dir / "record.json"
    args = th.train_args(data, ckpt, steps=steps, every=CHECKPOINT_EVERY)
    args[args.index("--grad-accum-steps") + 1] = str(grad_accum)
    completed = subprocess.run(
        [str(XLA_PYTHON), str(RUNNER), str(record_path), "--", *args, "--device", "xla"],
        env=th.env(PJRT_DEVICE="CPU", **env),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    record = json.loads(record_path.read_text())
    record["stdout"] = completed.stdout
    return record


@pytest.fixture(scope="module")
def xla_run(dataset, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("xla-run")
    return {**xla_train(folder, dataset, folder / "ckpt"), "ckpt": folder / "ckpt"}


@pytest.fixture(scope="module")
def accumulating_xla_run(dataset, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("xla-run-accumulating")
    return xla_train(folder, dataset, folder / "ckpt", steps=ACCUMULATING_STEPS, grad_accum=2)


@pytest.fixture(params=[1, 2], ids=["grad-accum-1", "grad-accum-2"])
def run_and_accum(request) -> tuple[dict, int]:
    return request.getfixturevalue("xla_run" if request.param == 1 else "accumulating_xla_run"), request.param


def test_the_head_stays_tied_to_the_embedding_on_the_xla_device(xla_run):
    # Moving a module to an XLA device unties shared parameters (PyTorch/XLA TROUBLESHOOTING.md, "XLA Tensor
    # Quirks"): found by these tests, the XLA path trained a separate head; workloads/gpt/builders.py ties it again.
    assert xla_run["tied"] is True


def test_the_loss_falls_on_the_xla_device(xla_run):
    losses = xla_run["losses"]
    assert len(losses) == STEPS and losses[-1] < 0.75 * losses[0], losses


def test_the_device_loader_feeds_every_batch_on_the_xla_device(xla_run):
    # Neuron docs: MpDeviceLoader moves each batch to the device (trainer.py builds it on the xla path).
    batches = xla_run["batches"]
    assert len(batches) == STEPS and all(b["device"] == "xla" for b in batches)
    assert {tuple(b["shape"]) for b in batches} == {(8, 64)}  # static shapes: one batch size and sequence length


def expected_events(steps: int, accum: int) -> list[str]:
    """Per step: the device loader's cut before each micro-batch, the optimizer step and the step's own cut; a
    checkpoint's cut after every CHECKPOINT_EVERY-th step and the last."""
    events: list[str] = []
    for step in range(1, steps + 1):
        events += ["sync:loader", "batch"] * accum + ["optimizer.step", "sync:train_step", "step_end"]
        events += ["sync:save"] if step % CHECKPOINT_EVERY == 0 or step == steps else []
    return events


def test_the_graph_is_cut_before_each_batch_and_right_after_the_optimizer_step(run_and_accum):
    # Neuron docs ("Developer Guide for Training with PyTorch NeuronX"): xm.mark_step() after optimizer.step().
    # MpDeviceLoader cuts too (torch_xla.sync before every batch), so with gradient accumulation each micro-batch's
    # forward and backward is a graph of its own. The checkpoint's cut materialises the step before its tensors are
    # read (checkpoint.py).
    run, accum = run_and_accum
    steps = len(run["losses"])
    assert run["events"] == expected_events(steps, accum), run["events"]
    # PyTorch/XLA's own count of cuts (step markers): the recorder saw every one.
    assert run["counters"]["MarkStep"] == len(run["cuts"])
    # Graphs run: each loader cut runs what is pending before the batch (the previous micro-batch's forward and
    # backward; before a step's first batch only the zero the loss sum starts from); the step's cut runs the last
    # micro-batch and the optimizer; the save's finds nothing pending. One more per step: reading the step's loss,
    # gradient norm and stop votes (trainer._agree).
    launched = {"loader": 1, "train_step": 1, "save": 0}
    assert [cut["graphs"] for cut in run["cuts"]] == [launched[cut["by"]] for cut in run["cuts"]], run["cuts"]
    assert run["steps"] == [{"mark_steps": accum + 1, "graphs": accum + 2}] * steps, run["steps"]
    # And PyTorch/XLA's count of executions: the steps' graphs and the replica checksum (trainer.fit), nothing else.
    counters = run["counters"]
    launches = counters["UncachedCompile"] + counters["CachedCompile"]
    assert counters["ExecuteComputation"] == launches == steps * (accum + 2) + 1, counters


def no_new_graph_after_warm_up(compiles: list[int]) -> bool:
    """PyTorch/XLA's UncachedCompile count does not grow after the warm-up steps."""
    return len(set(compiles[WARM_UP_STEPS - 1 :])) == 1


def test_after_the_warm_up_no_new_graph_is_compiled(xla_run):
    # The learning rate changes every step (warm-up, then cosine) and a checkpoint is saved at step 6: neither may
    # make a new graph (Neuron compiles each new graph, for minutes on Trainium).
    compiles = xla_run["compiles"]
    assert no_new_graph_after_warm_up(compiles), compiles
    # No save compiles (its cut finds nothing pending; it reads the tensors out). After the last step one graph is
    # new, once per run: the replica checksum that trainer.fit computes before the final save.
    saves = [(save["compiles_before"], save["compiles_after"]) for save in xla_run["saves"]]
    assert saves == [(compiles[CHECKPOINT_EVERY - 1],) * 2, (compiles[-1] + 1,) * 2], saves
    assert xla_run["counters"]["UncachedCompile"] == compiles[-1] + 1


def test_a_dynamic_shape_is_caught_by_the_compile_check(dataset, tmp_path):
    # The check has teeth: a loader whose sequence length changes from batch to batch makes a graph per batch.
    record = xla_train(tmp_path, dataset, tmp_path / "ckpt", steps=WARM_UP_STEPS + 1, XLA_RUN_DYNAMIC_SHAPES="1")
    assert not no_new_graph_after_warm_up(record["compiles"]), record["compiles"]


def _cpu_params(checkpoint: Path) -> dict[str, torch.Tensor]:
    """A checkpoint loaded on the CPU path the way validation loads it (saved_model.load_model, this venv's torch)."""
    from efa_training.workloads.gpt import saved_model

    model, _ = saved_model.load_model(checkpoint)
    return {name: p.detach().double().flatten() for name, p in model.named_parameters()}


def test_a_checkpoint_written_on_the_xla_path_loads_on_the_cpu_path_with_equal_parameters(xla_run):
    # The Neuron jobs' checkpoints are read by validation on CPU (validate.py has no XLA path) and by any GPU run.
    final = xla_run["ckpt"] / f"step_{STEPS:09d}"
    loaded = _cpu_params(final)
    assert set(loaded) == set(xla_run["params"])
    for name, values in xla_run["params"].items():
        assert torch.equal(loaded[name], torch.tensor(values, dtype=torch.float64)), name


def test_a_checkpoint_written_on_the_cpu_path_resumes_on_the_xla_path_with_equal_parameters(dataset, tmp_path):
    ckpt = tmp_path / "ckpt"
    cpu = th.single_process("train.py", th.train_args(dataset, ckpt, steps=6, every=6) + ["--device", "cpu"])
    assert cpu.returncode == 0, cpu.stderr[-2000:]
    record = xla_train(tmp_path, dataset, ckpt, steps=8)
    expected = _cpu_params(ckpt / f"step_{6:09d}")
    for name, values in record["start_params"].items():
        assert torch.equal(torch.tensor(values, dtype=torch.float64), expected[name]), name
    assert len(record["losses"]) == 2  # it went on from step 6, not from scratch


def test_the_xla_environment_is_the_neuron_images_pytorch_line():
    # requirements-xla.txt pins the PyTorch and PyTorch/XLA release that Dockerfile.neuron's base image carries.
    pins = dict(
        line.split("==")
        for line in (ROOT / "requirements-xla.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    dockerfile = (ROOT / "training_image" / "Dockerfile.neuron").read_text()
    (base,) = [line.split("=", 1)[1] for line in dockerfile.splitlines() if line.startswith("ARG BASE_IMAGE=")]
    image_torch = base.rsplit(":", 1)[1].split("-")[0]  # pytorch-training-neuronx:<torch>-neuronx-...
    assert pins["torch"] == image_torch and pins["torch-xla"].rsplit(".", 1)[0] == image_torch.rsplit(".", 1)[0]

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
STEPS, WARM_UP_STEPS = 12, 3
# All XLA runs on one xdist worker: each is a few CPU-heavy processes.
pytestmark = pytest.mark.xdist_group("xla")


def _require_xla_environment() -> None:
    if not XLA_PYTHON.exists():
        pytest.fail(f"{XLA_PYTHON} is missing: `make test` creates it from requirements-xla.txt")


def xla_train(out_dir: Path, data: Path, ckpt: Path, steps: int = STEPS, **env: str) -> dict:
    """train.py on the XLA CPU device (one process), its record from xla_run.py, and its stdout lines."""
    _require_xla_environment()
    record_path = out_dir / "record.json"
    args = th.train_args(data, ckpt, steps=steps, every=6)
    args[args.index("--grad-accum-steps") + 1] = "1"
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


def test_the_head_stays_tied_to_the_embedding_on_the_xla_device(xla_run):
    # Moving a module to an XLA device unties shared parameters (PyTorch/XLA TROUBLESHOOTING.md, "XLA Tensor
    # Quirks"): found by these tests, the XLA path trained a separate head; model_builders.py ties it again.
    assert xla_run["tied"] is True


def test_the_loss_falls_on_the_xla_device(xla_run):
    losses = xla_run["losses"]
    assert len(losses) == STEPS and losses[-1] < 0.75 * losses[0], losses


def test_the_device_loader_feeds_every_batch_on_the_xla_device(xla_run):
    # Neuron docs: MpDeviceLoader moves each batch to the device (trainer.py builds it on the xla path).
    batches = xla_run["batches"]
    assert len(batches) == STEPS and all(b["device"] == "xla" for b in batches)
    assert {tuple(b["shape"]) for b in batches} == {(8, 64)}  # static shapes: one batch size and sequence length


def test_mark_step_cuts_one_graph_per_step_right_after_the_optimizer_step(xla_run):
    # Neuron docs ("Developer Guide for Training with PyTorch NeuronX"): xm.mark_step() after optimizer.step(). The
    # only other cut is the checkpoint's, which materialises the step before its tensors are read (checkpoint.py).
    events = [e for e in xla_run["events"] if e != "batch"]
    cuts = [i for i, e in enumerate(events) if e.startswith("mark_step:")]
    in_step = [i for i in cuts if events[i] == "mark_step:train_step"]
    assert len(in_step) == STEPS and all(events[i - 1] == "optimizer.step" for i in in_step), events[:12]
    assert {events[i] for i in cuts} == {"mark_step:train_step", "mark_step:save"}


def no_new_graph_after_warm_up(compiles: list[int]) -> bool:
    """PyTorch/XLA's UncachedCompile count does not grow after the warm-up steps."""
    return len(set(compiles[WARM_UP_STEPS - 1 :])) == 1


def test_after_the_warm_up_no_new_graph_is_compiled(xla_run):
    # The learning rate changes every step (warm-up, then cosine) and a checkpoint is saved at step 6: neither may
    # make a new graph (Neuron compiles each new graph, for minutes on Trainium).
    assert no_new_graph_after_warm_up(xla_run["compiles"]), xla_run["compiles"]


def test_a_dynamic_shape_is_caught_by_the_compile_check(dataset, tmp_path):
    # The check has teeth: a loader whose sequence length changes from batch to batch makes a graph per batch.
    record = xla_train(tmp_path, dataset, tmp_path / "ckpt", steps=8, XLA_RUN_DYNAMIC_SHAPES="1")
    assert not no_new_graph_after_warm_up(record["compiles"]), record["compiles"]


def _cpu_params(checkpoint: Path) -> dict[str, torch.Tensor]:
    """A checkpoint loaded on the CPU path the way validation loads it (validate.load_model, this venv's torch)."""
    import validate

    model, _ = validate.load_model(checkpoint)
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

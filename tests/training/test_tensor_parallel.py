"""Tensor parallelism for the built-in GPT (workloads/gpt/parallel.py) on CPU with real processes (gloo): a run split
over 2 ranks matches the single-process run, a 2-D run (dp 2 x tp 2, 4 processes) matches FSDP over the same 2
replicas, a checkpoint resumes in another layout (2-D to FSDP alone, and back) where the same run would have gone, a
damaged newest checkpoint in the 2-D layout falls back to the one before and retrains bit for bit; and what a layout
refuses before any process group, in one line."""

import json
import warnings
from pathlib import Path

import pytest
import torch

from efa_training.runtime.errors import UsageError
from efa_training.workloads.gpt import preflight, saved_model
from efa_training.workloads.gpt.model import GPT, ModelConfig
from efa_training.workloads.gpt.sizes import MODEL_SIZES, memory_gb
from tests.training import layouts

# A state dict of release 0.8.0's GPT (a 1-layer model, one fused qkv layer) and its logits for a fixed input.
FIXTURE = Path(__file__).parent / "gpt_fixtures" / "gpt-tiny-0.8.0.pt"
STEPS, EVERY, MORE, close = layouts.STEPS, layouts.EVERY, layouts.MORE, layouts.close


tp2 = layouts.layout_fixture("tp-tp2", 2, "--tensor-parallel", "2")  # dp 1 x tp 2
grid = layouts.layout_fixture("tp-grid", 4, "--tensor-parallel", "2")  # dp 2 x tp 2


pytestmark = pytest.mark.slow  # real torchrun processes


def test_a_tensor_parallel_run_matches_the_single_process_run(fsdp_single, tp2):
    single = fsdp_single
    assert len(single.losses()) == STEPS and close(tp2.losses(), single.losses()), (tp2.losses(), single.losses())
    assert "world=2" in tp2.stderr


def test_a_2d_run_matches_fsdp_over_the_same_replicas(grid, fsdp_dp2):
    # Both read the same 2 streams of batches (a tensor-parallel group reads its replica's), so only tp differs.
    assert close(grid.losses(), fsdp_dp2.losses()), (grid.losses(), fsdp_dp2.losses())
    assert grid.summary()["mean_tokens_per_second"] > 0


def test_a_2d_checkpoint_resumes_in_fsdp_alone(grid, fsdp_dp2_resumed, dataset, tmp_path):
    # DCP reshards on load: the 2-D shards of step 6 become the FSDP shards of 2 processes.
    run = layouts.resumed(grid, tmp_path / "ckpt", 2, dataset)
    assert "resumed from" in run.stderr and "step_000000006" in run.stderr
    assert len(run.losses()) == MORE - STEPS and close(run.losses(), fsdp_dp2_resumed.losses())


def test_an_fsdp_checkpoint_resumes_in_2d(fsdp_dp2, fsdp_dp2_resumed, dataset, tmp_path):
    run = layouts.resumed(fsdp_dp2, tmp_path / "ckpt", 4, dataset, "--tensor-parallel", "2")
    assert "resumed from" in run.stderr
    assert len(run.losses()) == MORE - STEPS and close(run.losses(), fsdp_dp2_resumed.losses())


def test_a_damaged_2d_checkpoint_falls_back_and_retrains_bit_for_bit(grid, dataset, tmp_path):
    # The newest checkpoint's shard damaged: set aside, step 3 resumed in the same layout, steps 4-6 trained again
    # with exactly the uninterrupted run's losses (the same arithmetic in the same order).
    ckpt = layouts.damaged_newest(grid, tmp_path / "ckpt")
    run = layouts.train(dataset, ckpt, 4, "--tensor-parallel", "2")
    assert "step_000000003" in run.stderr and list(ckpt.glob(".damaged-step_000000006*"))
    assert run.losses() == grid.losses()[EVERY:]


def test_validation_reads_a_2d_checkpoint_into_a_plain_model(grid):
    model, meta, path = saved_model.find_and_load(grid.checkpoint_dir)
    assert path.name == "step_000000006" and meta["config"]["train"]["tensor_parallel"] == 2
    assert isinstance(model, GPT) and not any(hasattr(p, "device_mesh") for p in model.parameters())


# ---- what a layout refuses, and the checkpoints of release 0.8.0 -------------------------------------------------


def test_a_release_080_model_loads_with_its_fused_qkv_split():
    # A state dict of release 0.8.0's GPT (one fused qkv layer), saved with its logits for a fixed input.
    saved = torch.load(FIXTURE, weights_only=True)
    assert any(k.endswith("attn.qkv.weight") for k in saved["state"])
    model = GPT(ModelConfig(**saved["config"])).eval()
    model.load_state_dict(saved["state"])
    # The logits were computed on another CPU (and through one fused matmul): PyTorch promises no bit-equality across
    # machines ("Reproducibility": not "between CPU and GPU executions" nor across platforms), so float32's tolerances
    # of torch.testing.assert_close; a wrong split of q, k, v moves the logits by orders of magnitude more.
    with torch.no_grad():
        torch.testing.assert_close(model(saved["input"]), saved["logits"])


def test_a_release_080_fsdp_checkpoint_validates_through_its_fused_keys(tmp_path):
    # 0.8.0's FSDP wrote DCP shards under the fused keys; validation (and init_from) reads them into today's model.
    import json

    import torch.distributed.checkpoint as dcp

    from efa_training.checkpointing.format import file_record

    saved = torch.load(FIXTURE, weights_only=True)
    step = tmp_path / "step_000000010"
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"model": saved["state"]}, checkpoint_id=str(step), no_dist=True)
    for name in ("extra.pt", "rng_rank0.pt"):
        torch.save({}, step / name)
    files = {p.name: file_record(p) for p in step.iterdir()}
    config = {"train": {"model": "custom", "strategy": "fsdp"}, "model": saved["config"]}  # no tensor_parallel yet
    meta = {"step": 10, "format": "dcp", "world_size": 1, "config": config, "files": files}
    (step / "meta.json").write_text(json.dumps(meta))
    model, _ = saved_model.load_model(step)
    with torch.no_grad():  # float32's tolerances across machines, as above
        torch.testing.assert_close(model.eval()(saved["input"]), saved["logits"])


def test_resuming_a_release_080_run_is_refused_in_one_line(tmp_path):
    # A complete meta.json as 0.8.0 wrote it (an incomplete one is damage, set aside by the resume).
    (tmp_path / "step_000000010").mkdir()
    files = {name: {"bytes": 1, "crc32": 0, "rank": 0} for name in ("state.pt", "rng_rank0.pt")}
    meta = {"step": 10, "format": "full", "world_size": 1, "config": {"train": {"model": "tiny"}, "model": {}}}
    (tmp_path / "step_000000010" / "meta.json").write_text(json.dumps({**meta, "files": files}))
    with pytest.raises(UsageError, match="written by release 0.8.0 or earlier .* --init-from"):
        preflight.check_not_fused(tmp_path)


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"tensor_parallel": 2}, "needs --strategy fsdp, not ddp"),
        ({"tensor_parallel": 3, "strategy": "fsdp"}, "does not divide the 4 heads of model tiny"),
        ({"pipeline_parallel": 2}, "needs --strategy fsdp, not ddp"),
        ({"pipeline_parallel": 3, "strategy": "fsdp"}, "does not divide the 2 layers of model tiny"),
        ({"pipeline_parallel": 0, "strategy": "fsdp"}, "must be at least 1"),
    ],
)
def test_a_layout_the_model_cannot_take_is_refused(tmp_path, values, words):
    with pytest.raises(UsageError, match=words):
        layouts.config(tmp_path, **values)


def test_a_tensor_parallel_group_must_stay_inside_a_node():
    with pytest.raises(UsageError, match="does not divide a node's 6 workers .* one of 1, 2, 3, 6"):
        preflight.check_layout(4, {"LOCAL_WORLD_SIZE": "6"})
    preflight.check_layout(2, {"LOCAL_WORLD_SIZE": "8"})  # two groups per node


GPUS = {"ACCELERATOR_KIND": "gpu", "ACCELERATOR_MEMORY_GB": "80", "LOCAL_WORLD_SIZE": "8"}  # p5.48xlarge's H100s


def test_a_model_that_cannot_fit_is_refused_naming_a_layout_that_does(tmp_path):
    # 30b on 4 nodes of 8 H100s at micro-batch 4, a global batch of 128 sequences: FSDP alone would hold ~140 GB per
    # GPU; the refusal names the smallest tensor-parallel degree whose estimate fits (sizes.memory_gb) at the run's
    # micro-batch AND at the accumulation that keeps the global batch (tp t leaves 32 / t replicas: t micro-steps).
    need = {
        t: memory_gb(MODEL_SIZES["30b"], micro_batch=4, world=32, tensor_parallel=t, strategy="fsdp", microbatches=t)
        for t in (1, 2, 4, 8)
    }
    smallest = min(t for t, gb in need.items() if gb <= 80)
    assert need[1] > 80 and smallest > 1
    cfg = layouts.config(tmp_path, model="30b", strategy="fsdp", micro_batch_size=4)
    advice = f"--tensor-parallel {smallest} --pipeline-parallel 1 --micro-batch-size 4 --grad-accum-steps {smallest} "
    with pytest.raises(UsageError, match=rf"more than their 80 GB.*{advice}.*the global batch of 128 sequences kept"):
        preflight.check_memory(cfg, {**GPUS, "WORLD_SIZE": "32"})
    with pytest.raises(UsageError, match="more nodes, or a smaller global batch: no layout of 8 workers fits"):
        preflight.check_memory(cfg, {**GPUS, "WORLD_SIZE": "8"})
    fits = layouts.config(
        tmp_path, model="30b", strategy="fsdp", micro_batch_size=4, tensor_parallel=smallest, grad_accum_steps=smallest
    )
    preflight.check_memory(fits, {**GPUS, "WORLD_SIZE": "32"})  # no error
    preflight.check_memory(cfg, {"WORLD_SIZE": "64"})  # CPU (no memory given): not judged


def test_trainium_refuses_tensor_parallelism_in_one_line(tmp_path):
    # The XLA path trains with DDP semantics (xm.reduce_gradients); Neuron's tensor parallelism is
    # neuronx-distributed's, not wired here.
    from types import SimpleNamespace

    from efa_training.workloads.gpt.trainer import Trainer

    cfg = layouts.config(tmp_path, strategy="fsdp", tensor_parallel=2)
    with pytest.raises(UsageError, match="--tensor-parallel=2: not supported on the xla device"):
        Trainer(cfg, SimpleNamespace(device_type="xla"))  # type: ignore[arg-type]

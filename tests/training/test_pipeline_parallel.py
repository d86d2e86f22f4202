"""Pipeline parallelism for the built-in GPT (workloads/gpt/pipeline.py) on CPU with real processes (gloo): a run cut
into 2 stages matches the single-process run (1F1B over the step's 2 micro-batches, or its 1 cut in 2), and so do
pipeline 2 x tensor 2 and 4 stages; pipeline 2 x data 2 on 4 processes matches FSDP over the same 2 replicas; a
checkpoint resumes in another layout (2 stages to 1, 1 to 2) where the same run goes; a SIGKILLed pipeline resumes in
its layout bit for bit, and a damaged newest checkpoint of one falls back to the one before and retrains bit for bit;
validation reads a pipeline's checkpoint; and what a pipeline refuses before any process group, in one line
(train_config's refusals: beside tensor parallelism's, test_tensor_parallel.py)."""

import pytest

from efa_training.runtime.errors import UsageError
from efa_training.workloads.gpt import pipeline, preflight, saved_model
from efa_training.workloads.gpt.model import GPT, MODEL_SIZES
from efa_training.workloads.gpt.sizes import memory_gb, pipeline_microbatches
from tests.training import layouts
from tests.training import training_helpers as th

STEPS, EVERY, MORE, close = layouts.STEPS, layouts.EVERY, layouts.MORE, layouts.close
PP2 = ("--pipeline-parallel", "2")


pp2 = layouts.layout_fixture("pp-pp2", 2, *PP2)  # 2 stages, 1F1B over the step's 2 micro-batches
pp2_dp2 = layouts.layout_fixture("pp-pp2-dp2", 4, *PP2)  # 2 stages x 2 replicas
pp2_tp2 = layouts.layout_fixture("pp-pp2-tp2", 4, *PP2, "--tensor-parallel", "2")  # 2 stages, each split over 2 ranks

pytestmark = pytest.mark.slow  # real torchrun processes


def test_a_pipeline_run_matches_the_single_process_run(fsdp_single, pp2):
    assert len(pp2.losses()) == STEPS and close(pp2.losses(), fsdp_single.losses()), (pp2.losses(), fsdp_single)
    assert "world=2" in pp2.stderr


def test_a_step_of_one_micro_batch_is_cut_into_as_many_microbatches_as_stages_and_matches(dataset, tmp_path):
    # 1 micro-step of 8 sequences on 2 stages: 2 microbatches of 4 (1F1B needs as many as stages), the same mean.
    one = ("--grad-accum-steps", "1")
    single = layouts.train(dataset, tmp_path / "single", 1, *one, steps=2)
    run = layouts.train(dataset, tmp_path / "pp2", 2, *PP2, *one, steps=2)
    assert close(run.losses(), single.losses()), (run.losses(), single.losses())


@pytest.mark.parametrize(
    ("stages", "micro_steps", "micro_batch", "microbatches"),
    [(2, 2, 8, 2), (2, 4, 8, 4), (4, 1, 8, 4), (4, 1, 6, 6), (4, 2, 3, 6), (4, 1, 2, 2), (8, 1, 1, 1)],
)
def test_the_microbatches_are_the_micro_steps_or_the_fewest_equal_parts_as_many_as_the_stages(
    stages, micro_steps, micro_batch, microbatches
):
    # Fewer sequences than stages (the last two): one microbatch each, GPipe's schedule.
    assert pipeline_microbatches(stages, micro_steps, micro_batch) == microbatches


def test_four_stages_with_two_middle_ones_match_the_single_process_run(dataset, tmp_path):
    # The mini model's 4 layers on 4 stages: the middle stages hold blocks only and take no part in the shared
    # embedding's sum; 4 steps on 4 processes against one.
    mini = ("--model", "mini")
    single = layouts.train(dataset, tmp_path / "single", 1, *mini, steps=4)
    run = layouts.train(dataset, tmp_path / "pp4", 4, *mini, "--pipeline-parallel", "4", steps=4)
    assert close(run.losses(), single.losses()), (run.losses(), single.losses())


def test_pipeline_2_by_data_2_matches_fsdp_over_the_same_replicas(pp2_dp2, fsdp_dp2):
    # Both read the same 2 streams of batches (a pipeline's stages read their replica's), so only the stages differ.
    assert close(pp2_dp2.losses(), fsdp_dp2.losses()), (pp2_dp2.losses(), fsdp_dp2.losses())


def test_pipeline_2_by_tensor_2_matches_the_single_process_run(pp2_tp2, fsdp_single):
    # The 3-D mesh (pp 2, dp 1, tp 2): each stage's blocks split over its 2 ranks.
    assert close(pp2_tp2.losses(), fsdp_single.losses()), (pp2_tp2.losses(), fsdp_single.losses())


def test_a_pipeline_checkpoint_resumes_without_the_pipeline(pp2_dp2, fsdp_dp2_resumed, dataset, tmp_path):
    # DCP reshards on load: the two stages' shards of step 6 (each holding the shared embedding) become FSDP's.
    run = layouts.resumed(pp2_dp2, tmp_path / "ckpt", 2, dataset)
    assert "resumed from" in run.stderr and "step_000000006" in run.stderr
    assert len(run.losses()) == MORE - STEPS and close(run.losses(), fsdp_dp2_resumed.losses())


def test_an_fsdp_checkpoint_resumes_in_a_pipeline(fsdp_dp2, fsdp_dp2_resumed, dataset, tmp_path):
    # The last stage asks for the optimizer state of `tok_emb.weight` (its head is tied to it), which FSDP wrote.
    run = layouts.resumed(fsdp_dp2, tmp_path / "ckpt", 4, dataset, *PP2)
    assert "resumed from" in run.stderr
    assert len(run.losses()) == MORE - STEPS and close(run.losses(), fsdp_dp2_resumed.losses())


def test_a_damaged_pipeline_checkpoint_falls_back_and_retrains_bit_for_bit(pp2, dataset, tmp_path):
    # The newest checkpoint's shard damaged: set aside, step 3 resumed in the same layout, steps 4-6 trained again
    # with exactly the uninterrupted run's losses (the same arithmetic in the same order).
    ckpt = layouts.damaged_newest(pp2, tmp_path / "ckpt")
    run = layouts.train(dataset, ckpt, 2, *PP2)
    assert "step_000000003" in run.stderr and list(ckpt.glob(".damaged-step_000000006*"))
    assert run.losses() == pp2.losses()[EVERY:]


def test_a_sigkilled_pipeline_resumes_in_its_layout_bit_for_bit(pp2, dataset, tmp_path):
    # Every process of a 2-stage job SIGKILLed once its step-3 checkpoint exists (each micro-batch slowed, so the
    # kill comes before step 6: slow_train.py); the same command then resumes at step 3 and trains steps 4-6 with
    # exactly the uninterrupted run's losses.
    ckpt = tmp_path / "ckpt"
    args = [*th.train_args(dataset, ckpt, steps=STEPS, every=EVERY, strategy="fsdp"), *PP2]
    job = th.Background("slow_train.py", args, tmp_path, TRAIN_TEST_BATCH_DELAY_S="0.3")
    job.wait_for(lambda: th.checkpoint_steps(ckpt) == [EVERY])
    job.kill_group()
    assert th.checkpoint_steps(ckpt) == [EVERY]
    run = layouts.train(dataset, ckpt, 2, *PP2)
    assert f"resumed from {ckpt}/step_000000003" in run.stderr
    assert run.losses() == pp2.losses()[EVERY:]


def test_validation_reads_a_pipeline_checkpoint_into_the_whole_model(pp2):
    model, meta, path = saved_model.find_and_load(pp2.checkpoint_dir)
    assert path.name == "step_000000006" and meta["config"]["train"]["pipeline_parallel"] == 2
    assert isinstance(model, GPT) and model.lm_head is not None and model.tok_emb is not None
    assert model.lm_head.weight is model.tok_emb.weight
    assert len(model.blocks) == MODEL_SIZES["tiny"].n_layer


def test_a_pipeline_starts_from_another_runs_weights(fsdp_single, dataset, tmp_path):
    # --init-from (an approved model): each stage takes its own layers of the whole model's weights, the last stage
    # the head the embedding shares; the first loss is where that run ended, not a fresh model's (ln 257 = 5.55).
    assert fsdp_single.checkpoint_dir is not None
    run = layouts.train(dataset, tmp_path / "ckpt", 2, *PP2, "--init-from", str(fsdp_single.checkpoint_dir), steps=2)
    assert f"starting from the weights of {fsdp_single.checkpoint_dir}" in run.stderr
    final, first = fsdp_single.losses()[-1], run.losses()[0]
    assert abs(first - final) < 0.10 * final and first < fsdp_single.losses()[0] - 1.0, (first, final)


# ---- the stages, and what a pipeline refuses ------------------------------------------------------------------------


def test_each_stage_keeps_its_layers_under_their_own_names():
    stages = [pipeline.keep_stage(GPT(MODEL_SIZES["mini"]), s, 2) for s in range(2)]
    first, last = (set(m.state_dict()) for m in stages)
    assert {k.split(".")[1] for k in first if k.startswith("blocks.")} == {"0", "1"}
    assert {k.split(".")[1] for k in last if k.startswith("blocks.")} == {"2", "3"}
    assert "pos_emb.weight" in first and "lm_head.weight" not in first
    # The last stage's head stays tied to an embedding of its own, so both stages name the shared weight alike.
    assert {"tok_emb.weight", "lm_head.weight", "ln_f.weight"} <= last and "pos_emb.weight" not in last
    head, embedding = stages[1].lm_head, stages[1].tok_emb
    assert head is not None and embedding is not None and head.weight is embedding.weight


def test_a_middle_stage_holds_blocks_only():
    middle = pipeline.keep_stage(GPT(MODEL_SIZES["mini"]), 1, 4)
    assert set(middle.state_dict()) == {k for k in GPT(MODEL_SIZES["mini"]).state_dict() if k.startswith("blocks.1.")}


def test_pipeline_stages_times_the_tensor_parallel_groups_must_divide_the_world():
    # 3 stages of 2-way tensor parallelism are 6 ranks, which 8 workers cannot hold whole; the refusal names the
    # stage counts that fit both the world and the model's layers.
    with pytest.raises(UsageError, match=r"times --tensor-parallel 2 does not divide the 8 workers.*one of 1, 2$"):
        preflight.check_layout(2, {"LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "8"}, 3, layers=2)
    preflight.check_layout(2, {"LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "8"}, 4, layers=88)  # 2 replicas: no error


GPUS = {"ACCELERATOR_KIND": "gpu", "ACCELERATOR_MEMORY_GB": "80", "LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "64"}


def test_a_model_that_tensor_parallelism_alone_cannot_fit_is_refused_naming_pipeline_stages(tmp_path):
    # 70b on 8 nodes of 8 H100s at micro-batch 2, a global batch of 128 sequences: no tensor-parallel degree alone
    # fits at the accumulation that keeps it (tp 8: 8 micro-steps, ~96 GB, its fp32 gradients whole between them), nor
    # 2 stages (whose weights and gradients stay whole between microbatches); 4 stages of tp 8 do (sizes.memory_gb).
    def need(t: int, p: int) -> float:
        accum = 128 // (64 // (t * p) * 2)
        return memory_gb(
            MODEL_SIZES["70b"], micro_batch=2, world=64, tensor_parallel=t, strategy="fsdp", pipeline_parallel=p,
            microbatches=accum,
        )  # fmt: skip

    assert min(need(t, 1) for t in (1, 2, 4, 8)) > 80 and min(need(t, 2) for t in (1, 2, 4, 8)) > 80
    assert need(4, 4) > 80 >= need(8, 4)
    cfg = layouts.config(tmp_path, model="70b", strategy="fsdp", micro_batch_size=2)
    advice = "--tensor-parallel 8 --pipeline-parallel 4 --micro-batch-size 2 --grad-accum-steps 32 "
    with pytest.raises(UsageError, match=advice):
        preflight.check_memory(cfg, GPUS)
    fits = layouts.config(
        tmp_path, model="70b", strategy="fsdp", micro_batch_size=2, tensor_parallel=8, pipeline_parallel=4,
        grad_accum_steps=32,
    )  # fmt: skip
    preflight.check_memory(fits, GPUS)  # no error

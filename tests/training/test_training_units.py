"""Small pure pieces: shard format, data order, LR schedule, EMF records, checkpoint atomicity."""
import json

import numpy as np
import pytest

import data
import metrics
import train
from errors import UsageError


def test_shard_round_trip(tmp_path):
    tokens = np.array([1, 2, 256, 65535], dtype=np.uint16)
    data.write_shard(tmp_path / "train_000000.bin", tokens)
    assert np.array_equal(data.open_shard(tmp_path / "train_000000.bin"), tokens)


def test_truncated_shard_is_rejected(tmp_path):
    path = tmp_path / "train_000000.bin"
    data.write_shard(path, np.arange(100, dtype=np.uint16))
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(UsageError, match="truncated"):
        data.open_shard(path)


def test_data_position_does_not_depend_on_world_size(dataset):
    stream = data.TokenStream(dataset, "train")
    one = data.SequenceBatches(stream, data.BatchSpec(16, 4, rank=0, world_size=1, seed=3))
    two = [data.SequenceBatches(stream, data.BatchSpec(16, 2, rank=r, world_size=2, seed=3)) for r in range(2)]
    x1, _ = next(one)
    x2 = np.concatenate([next(b)[0].numpy() for b in two])
    assert np.array_equal(x1.numpy(), x2) and one.position == two[0].position == 4


def test_lr_warms_up_then_decays_to_the_floor():
    cfg = train.TrainConfig(data="d", checkpoint_dir="c", max_steps=100, warmup_steps=10, min_lr_ratio=0.1)
    f = train.lr_lambda(cfg)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0) and f(100) == pytest.approx(0.1)
    assert f(10) > f(50) > f(99)


def test_emf_record_declares_the_dashboard_metric_names():
    rec = metrics.emf_record("run-1", 5, {"Loss": 1.0, "TokensPerSecond": 2.0, "StepTimeSeconds": 0.5, "MFU": 40.0})
    decl = rec["_aws"]["CloudWatchMetrics"][0]
    assert decl["Namespace"] == "EfaTraining" and decl["Dimensions"] == [["RunId"]]
    assert [m["Name"] for m in decl["Metrics"]] == ["Loss", "TokensPerSecond", "StepTimeSeconds", "MFU"]
    assert rec["RunId"] == "run-1" and json.loads(json.dumps(rec)) == rec


@pytest.mark.parametrize("loss", [float("nan"), float("inf")])
def test_non_finite_loss_is_reported_as_a_count_in_valid_json(loss):
    # CloudWatch drops lines that are not JSON; a diverged step must still reach the NonFiniteLoss alarm.
    import io

    stream = io.StringIO()
    metrics.MetricsLogger("run-1", enabled=True, stream=stream).step(7, loss, 100.0, 0.5)
    record = json.loads(stream.getvalue(), parse_constant=lambda name: pytest.fail(f"{name} written"))
    assert record["NonFiniteLoss"] == 1 and "Loss" not in record
    assert "Loss" not in [m["Name"] for m in record["_aws"]["CloudWatchMetrics"][0]["Metrics"]]


def test_finite_loss_reports_zero_non_finite_steps():
    # The alarm's metric exists on every healthy step too, so "no data" never hides a diverged run.
    import io

    stream = io.StringIO()
    metrics.MetricsLogger("run-1", enabled=True, stream=stream).step(7, 2.5, 100.0, 0.5)
    record = json.loads(stream.getvalue())
    assert (record["NonFiniteLoss"], record["Loss"]) == (0, 2.5)


@pytest.mark.slow
def test_training_emits_emf_lines_and_a_summary(ddp_reference):
    assert len(ddp_reference.emf()) == 30 and ddp_reference.summary()["steps"] == 30


@pytest.mark.parametrize("module", ["train", "validate", "sanity_check", "prepare_data", "local_run"])
def test_every_flag_has_help_text(module):
    import importlib
    parser = importlib.import_module(module).build_parser()
    assert all(action.help for action in parser._actions)


def _tiny_trainer():
    """Model, optimizer and scheduler of the tiny size, as train.py builds them (world of one, no DDP)."""
    import torch
    from model import GPT, model_config
    torch.manual_seed(0)
    model = GPT(model_config("tiny"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def _save(manager, trainer, step: int):
    import checkpoint
    return manager.save(*trainer, checkpoint.TrainerState(step=step), {"train": {"model": "tiny"}})


def _load(manager, trainer):
    import torch
    return manager.load_latest(*trainer, torch.device("cpu"))


def test_interrupted_save_leaves_previous_checkpoints_loadable(tmp_path, monkeypatch):
    # A save that fails part-way (here: at the rename into place) leaves the previous checkpoint the newest.
    import checkpoint
    trainer = _tiny_trainer()
    manager = checkpoint.CheckpointManager(tmp_path, "full", keep_last=3, rank=0, world_size=1)
    _save(manager, trainer, 10)

    def failing_replace(src, dst):
        raise OSError(5, "Input/output error (injected)")
    monkeypatch.setattr(checkpoint.os, "replace", failing_replace)
    with pytest.raises(OSError, match="injected"):
        _save(manager, trainer, 20)
    monkeypatch.undo()
    assert (tmp_path / ".tmp-step_000000020" / "meta.json").exists()  # the half-done save is really there
    assert [p.name for p in checkpoint.step_dirs(tmp_path)] == ["step_000000010"]
    state, path = _load(manager, trainer)
    assert (state.step, path.name) == (10, "step_000000010")


def test_save_after_skipping_a_corrupt_newer_checkpoint_keeps_the_live_one(tmp_path, capsys):
    # The corrupt newer checkpoint is set aside when the run resumes, so pruning counts only the live ones.
    import checkpoint
    trainer = _tiny_trainer()
    manager = checkpoint.CheckpointManager(tmp_path, "full", keep_last=1, rank=0, world_size=1)
    for step in (2, 4, 6):
        _save(checkpoint.CheckpointManager(tmp_path, "full", keep_last=3, rank=0, world_size=1), trainer, step)
    state_file = tmp_path / "step_000000006" / "state.pt"
    state_file.write_bytes(state_file.read_bytes()[: state_file.stat().st_size // 2])
    assert _load(manager, trainer)[0].step == 4
    assert (tmp_path / ".damaged-step_000000006" / "meta.json").exists()
    assert "step_000000006 is damaged: state.pt: " in capsys.readouterr().err
    _save(manager, trainer, 5)
    assert [p.name for p in checkpoint.step_dirs(tmp_path)] == ["step_000000005"]
    assert _load(manager, trainer)[0].step == 5


def test_save_older_than_an_existing_checkpoint_moves_the_newer_aside(tmp_path, capsys):
    # A checkpoint newer than the one just saved belongs to an abandoned timeline: moved aside, not pruned by number.
    import checkpoint
    trainer = _tiny_trainer()
    manager = checkpoint.CheckpointManager(tmp_path, "full", keep_last=1, rank=0, world_size=1)
    for step in (6, 5):
        _save(manager, trainer, step)
    assert [p.name for p in checkpoint.step_dirs(tmp_path)] == ["step_000000005"]
    assert (tmp_path / ".abandoned-step_000000006" / "meta.json").exists()
    assert "moved step_000000006" in capsys.readouterr().err


def test_checkpoint_of_another_format_is_skipped_without_claiming_a_partial_load(tmp_path):
    # A DDP ("full") checkpoint read by an FSDP ("dcp") manager is skipped before DCP touches the model.
    import checkpoint
    trainer = _tiny_trainer()
    _save(checkpoint.CheckpointManager(tmp_path, "full", keep_last=3, rank=0, world_size=1), trainer, 3)
    assert _load(checkpoint.CheckpointManager(tmp_path, "dcp", keep_last=3, rank=0, world_size=1), trainer) is None


def test_checkpoint_of_another_model_is_not_applied_silently(tmp_path):
    # A size mismatch while applying a checkpoint is a skip, and then an error (the model was touched).
    import torch

    import checkpoint
    from model import GPT, model_config
    _save(checkpoint.CheckpointManager(tmp_path, "full", keep_last=3, rank=0, world_size=1), _tiny_trainer(), 3)
    mini = GPT(model_config("mini"))
    optimizer = torch.optim.AdamW(mini.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    manager = checkpoint.CheckpointManager(tmp_path, "full", keep_last=3, rank=0, world_size=1)
    with pytest.raises(RuntimeError, match="no checkpoint .* could be loaded"):
        _load(manager, (mini, optimizer, scheduler))


def test_pipeline_layout_flags_name_the_data_and_checkpoint_dirs():
    import argparse
    import run_paths
    args = argparse.Namespace(data=None, checkpoint_dir=None, datasets_root="/fsx/datasets",
                              dataset="datasets/wikitext/", checkpoints_root="/fsx/checkpoints", run_id="run-7")
    assert run_paths.data_dir(args) == "/fsx/datasets/wikitext"
    assert run_paths.checkpoint_dir(args, "--checkpoint-dir") == "/fsx/checkpoints/run-7"


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_verdict_for_a_diverged_model_is_strict_json_and_rejected(value):
    # The pipeline's States.StringToJson needs strict JSON: no NaN/Infinity, and the model must not pass.
    import validate
    doc = json.loads(json.dumps(validate.verdict(value, 2.0, 0.001), allow_nan=False))
    assert (doc["passed"], doc["value"], doc["perplexity"], doc["delta"]) == (False, None, None, None)


def test_perplexity_of_a_huge_finite_loss_does_not_overflow():
    # math.exp overflows above ~709.78; the verdict must still be written (and reject the model).
    import validate
    doc = validate.verdict(800.0, 2.0, 0.001)
    assert (doc["passed"], doc["value"], doc["perplexity"]) == (False, 800.0, None)


def test_training_summary_with_infinite_loss_is_strict_json():
    # A diverged run's summary line must still parse: Infinity becomes null.
    import io

    stream = io.StringIO()
    metrics.MetricsLogger("run-1", enabled=True, stream=stream).summary({"final_loss": float("inf"), "steps": 3})
    line = json.loads(stream.getvalue(), parse_constant=lambda name: pytest.fail(f"{name} written"))
    assert line["summary"] == {"final_loss": None, "steps": 3}


def test_neuron_node_without_torch_xla_is_a_usage_error(monkeypatch):
    # ACCELERATOR_KIND=neuron in an image without torch_xla: one line naming the cause, no ImportError.
    import distributed
    monkeypatch.setenv("ACCELERATOR_KIND", "neuron")
    monkeypatch.setattr(distributed.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UsageError, match="torch_xla .* not installed"):
        distributed.resolve_device("auto")


def test_acceptance_rule_is_relative_tolerance_on_lower_is_better():
    import validate
    assert validate.verdict(1.0009, 1.0, 0.001)["passed"] is True
    assert validate.verdict(1.0011, 1.0, 0.001)["passed"] is False
    assert validate.verdict(0.9, 1.0, 0.001)["passed"] is True


def test_resaving_a_step_has_no_moment_without_that_step(tmp_path, monkeypatch):
    # Killed between the two renames of a re-save: the old copy (.replaced-) is still found and loads.
    import checkpoint
    trainer = _tiny_trainer()
    manager = checkpoint.CheckpointManager(tmp_path, "full", keep_last=3, rank=0, world_size=1)
    _save(manager, trainer, 10)
    real_replace, calls = checkpoint.os.replace, []

    def replace_then_die(src, dst):
        calls.append(src)
        if len(calls) == 2:
            raise OSError(5, "killed between the renames (injected)")
        real_replace(src, dst)
    monkeypatch.setattr(checkpoint.os, "replace", replace_then_die)
    with pytest.raises(OSError, match="injected"):
        _save(manager, trainer, 10)
    monkeypatch.undo()
    assert [p.name for p in checkpoint.step_dirs(tmp_path)] == [".replaced-step_000000010"]
    assert _load(manager, trainer)[0].step == 10
    _save(manager, trainer, 10)  # the next save of that step cleans up
    assert sorted(p.name for p in tmp_path.iterdir() if "step_" in p.name) == ["step_000000010"]


def test_rng_state_is_restored_from_a_weights_only_file(tmp_path):
    import random

    import torch

    import checkpoint
    manager = checkpoint.CheckpointManager(tmp_path, "full", keep_last=3, rank=0, world_size=1)
    _save(manager, _tiny_trainer(), 1)
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(99), np.random.seed(99), torch.manual_seed(99)
    checkpoint.set_rng_state(torch.load(tmp_path / "step_000000001" / "rng_rank0.pt", weights_only=True))
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


def test_checkpoint_missing_a_ranks_state_is_incomplete(tmp_path):
    import checkpoint
    _save(checkpoint.CheckpointManager(tmp_path, "full", keep_last=3, rank=0, world_size=1), _tiny_trainer(), 1)
    meta_file = tmp_path / "step_000000001" / "meta.json"
    meta_file.write_text(json.dumps({**json.loads(meta_file.read_text()), "world_size": 2}))  # rank 1 wrote nothing
    with pytest.raises(checkpoint.CheckpointDamaged, match="incomplete: the manifest lacks rng_rank1.pt"):
        checkpoint.verify(tmp_path / "step_000000001", "full")


def test_incomplete_meta_json_does_not_block_start_up(tmp_path):
    # check_reusable reads the newest *complete* meta.json; a broken one is set aside later, not a usage error.
    import checkpoint
    (tmp_path / "step_000000009").mkdir()
    (tmp_path / "step_000000009" / "meta.json").write_text('{"step": 9}')
    checkpoint.check_reusable(tmp_path, "fsdp", "tiny", {})


@pytest.mark.parametrize("loss, norm, lowest, expected", [
    (float("nan"), 1.0, 2.0, "loss nan"),
    (2.0, float("inf"), 2.0, "gradient norm inf"),
    (25.0, 1.0, 2.0, "more than 10 times its lowest value 2"),
    (19.0, 1.0, 2.0, None),
    (6.0, 1.0, float("inf"), None),  # the first step has nothing to compare with
])
def test_divergence_is_a_non_finite_loss_or_norm_or_a_spike(loss, norm, lowest, expected):
    reason = train.divergence(loss, norm, lowest, 10.0)
    assert (reason is None) if expected is None else (expected in reason), reason


def test_second_writer_is_told_who_holds_the_folder(tmp_path):
    import checkpoint
    first = checkpoint.lock_folder(tmp_path, {"host": "node-a", "pid": 1})
    try:
        assert checkpoint.lock_folder(tmp_path, {"host": "node-b"}) == '{"host": "node-a", "pid": 1}'
    finally:
        first.close()


def test_relayed_exit_code_is_the_first_failure_of_the_last_restart(tmp_path):
    import exit_relay
    for name, text in {"restart0-rank0": "4 10.0", "restart1-rank0": "143 30.0", "restart1-rank1": "5 20.0"}.items():
        (tmp_path / name).write_text(text)
    assert exit_relay.relayed_exit_code(tmp_path, 1) == 5  # restart 1: rank 1 failed first, rank 0 was stopped
    assert exit_relay.relayed_exit_code(tmp_path, 0) == 0
    (tmp_path / "restart1-rank0").write_text("1 15.0")
    assert exit_relay.relayed_exit_code(tmp_path, 1) == 1  # a crash first: torchrun's own code
    assert exit_relay.relayed_exit_code(tmp_path / "empty", 1) == 1


def test_a_restart_after_a_final_code_ends_the_same_way_without_running_again(tmp_path, monkeypatch):
    # torchrun restarts the group after a refusal too; the relay ends it at once with the same code.
    import exit_relay
    (tmp_path / "restart0-rank1").write_text("5 10.0")
    monkeypatch.setenv(exit_relay.EXIT_CODE_DIR, str(tmp_path))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(exit_relay.sys, "argv", ["exit_relay.py", str(tmp_path / "never-run.py")])
    with pytest.raises(SystemExit) as exit_info:
        exit_relay.main()
    assert exit_info.value.code == 5 and (tmp_path / "restart1-rank1").read_text().startswith("5 ")
    (tmp_path / "restart0-rank1").write_text("1 10.0")  # a crash: the restart runs the script again
    assert exit_relay.previous_final_code() is None


@pytest.mark.slow
def test_default_interval_is_young_daly_from_the_first_save(dataset, tmp_path):
    # --checkpoint-every 0: save at step 20, measure, then every sqrt(2 * C * MTBF) / step time steps.
    import re

    import training_helpers as th
    run = th.single_process("train.py", [*th.train_args(dataset, tmp_path, steps=26, every=0),
                                         "--mtbf-hours", "0.0001", "--keep-last", "100"])
    found = re.search(r"checkpoint: every (\d+) steps \(Young/Daly: sqrt\(2 x ", run.stderr)
    assert run.returncode == 0 and found, run.stderr[-2000:]
    k = int(found.group(1))
    assert th.checkpoint_steps(tmp_path) == sorted({20, 26} | {s for s in range(21, 27) if s % k == 0})


def test_emf_record_carries_the_environment_dimension_when_the_job_names_one():
    # Alarms and dashboards of one environment query Environment and RunId: the line declares both.
    rec = metrics.emf_record("run-1", 5, {"Loss": 1.0}, environment="prod")
    assert rec["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["Environment", "RunId"]]
    assert (rec["Environment"], rec["RunId"]) == ("prod", "run-1")
    assert metrics.emf_record("run-1", 5, {"Loss": 1.0})["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["RunId"]]

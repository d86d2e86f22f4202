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


def test_interrupted_save_leaves_previous_checkpoints_loadable(tmp_path):
    import checkpoint
    (tmp_path / "step_000000010").mkdir()
    (tmp_path / "step_000000010" / "meta.json").write_text("{}")
    (tmp_path / ".tmp-step_000000020").mkdir()  # a save killed before its rename
    assert [p.name for p in checkpoint.step_dirs(tmp_path)] == ["step_000000010"]


def test_pipeline_layout_flags_name_the_data_and_checkpoint_dirs():
    import argparse
    import run_paths
    args = argparse.Namespace(data=None, checkpoint_dir=None, datasets_root="/fsx/datasets",
                              dataset="datasets/wikitext/", checkpoints_root="/fsx/checkpoints", run_id="run-7")
    assert run_paths.data_dir(args) == "/fsx/datasets/wikitext"
    assert run_paths.checkpoint_dir(args, "--checkpoint-dir") == "/fsx/checkpoints/run-7"


def test_acceptance_rule_is_relative_tolerance_on_lower_is_better():
    import validate
    assert validate.verdict(1.0009, 1.0, 0.001)["passed"] is True
    assert validate.verdict(1.0011, 1.0, 0.001)["passed"] is False
    assert validate.verdict(0.9, 1.0, 0.001)["passed"] is True

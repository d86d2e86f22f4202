"""Criteo records (workloads/ctr_ps/criteo.py), prepare-data --format criteo, and the sparse model's settings."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from efa_training import prepare_data
from efa_training.runtime.errors import UsageError
from efa_training.train_config import TrainConfig
from efa_training.workloads.ctr_ps import criteo, evaluate, sample
from efa_training.workloads.ctr_ps.model import CTR_SIZES, CtrModel, table_rows

LINE = "\t".join(["1", "3", "", "-2", *["0"] * 10, "68fd1e64", "", *["80e26c9b"] * 24])


def test_a_criteo_line_becomes_one_record_as_dlrm_preprocesses_it():
    (record,) = criteo.parse_lines([LINE + "\n"])
    assert record["label"] == 1
    # log(1 + max(x, 0)); an empty count and a negative one are 0.
    assert record["dense"][:3].tolist() == pytest.approx([np.log(4.0), 0.0, 0.0])
    assert record["sparse"][0] == 0x68FD1E64 and record["sparse"][1] == 0  # an empty category hashes to 0


@pytest.mark.parametrize(
    "line, words",
    [
        ("1\t2\t3", "3 tab-separated fields, not 40"),
        (LINE.replace("1", "2", 1), "label '2' is not 0 or 1"),
        (LINE.replace("68fd1e64", "zz"), "invalid literal"),
        (LINE.replace("68fd1e64", "1ffffffff"), "not a 32-bit hex hash"),
    ],
)
def test_a_malformed_line_is_one_usage_error_naming_file_and_line(line, words):
    with pytest.raises(UsageError) as err:
        criteo.parse_lines([LINE, line], "day_0.txt")
    assert "day_0.txt:2" in str(err.value) and words in str(err.value)


def test_prepare_data_writes_record_shards_that_read_back(tmp_path):
    sample.generate(tmp_path / "day_0.txt", 1000, seed=1)
    out = tmp_path / "data"
    args = ["--format", "criteo", "--input", str(tmp_path / "day_0.txt"), "--output", str(out)]
    assert prepare_data.main([*args, "--val-fraction", "0.1", "--shard-tokens", "400"]) == 0
    assert sorted(p.name for p in out.glob("train_*")) == ["train_000000.ctr", "train_000001.ctr", "train_000002.ctr"]
    train, val = criteo.CtrRecords(out, "train"), criteo.CtrRecords(out, "val")
    assert (train.n, val.n) == (900, 100)
    text = (tmp_path / "day_0.txt").read_text().splitlines()
    assert np.array_equal(train.take(np.arange(900)), criteo.parse_lines(text[:900]))


def test_a_truncated_shard_is_refused(tmp_path):
    records = criteo.parse_lines([LINE] * 3)
    criteo.write_records(tmp_path / "train_000000.ctr", records)
    with open(tmp_path / "train_000000.ctr", "r+b") as f:
        f.truncate(criteo.HEADER.size + 2 * criteo.CTR_RECORD.itemsize)
    with pytest.raises(UsageError, match="not the header's 3 records"):
        criteo.CtrRecords(tmp_path, "train")


def test_workers_read_disjoint_blocks_that_cover_the_data_in_order():
    seen = [criteo.block_indices(w, 3, 4, position) for position in range(0, 40, 4) for w in range(3)]
    flat = np.concatenate(seen)
    assert sorted(flat.tolist()) == list(range(120))  # every record once, none twice


def test_auc_is_the_probability_a_click_outranks_a_non_click():
    rng = np.random.default_rng(0)
    labels, scores = rng.random(300) < 0.3, np.round(rng.random(300), 1)  # many ties
    pairs = [(p, n) for p, n in itertools.product(scores[labels], scores[~labels])]
    brute = np.mean([1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs])
    assert evaluate.auc(labels, scores) == pytest.approx(brute)


def test_log_loss_matches_torch_binary_cross_entropy():
    labels, logits = np.array([1.0, 0.0, 1.0]), np.array([2.0, -1.0, -30.0])
    expected = torch.nn.functional.binary_cross_entropy_with_logits(torch.tensor(logits), torch.tensor(labels)).item()
    assert evaluate.log_loss(labels, logits) == pytest.approx(expected)


def test_the_model_maps_hashes_to_their_tables_rows():
    rows = table_rows(torch.tensor([[5] * 26, [1029] * 26]), 1024)
    assert rows[0, 0] == 5 and rows[0, 1] == 1024 + 5 and rows[1, 25] == 25 * 1024 + 5


def test_the_model_gives_one_logit_per_impression():
    cfg = CTR_SIZES["ctr-tiny"]
    logits = CtrModel(cfg)(torch.zeros(4, 13), torch.zeros(4, 26, cfg.dim))
    assert logits.shape == (4,)


def test_ctr_large_holds_hundreds_of_millions_of_rows():
    assert CTR_SIZES["ctr-large"].table_rows == 260_000_000


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"strategy": "ps", "model": "tiny"}, "trains with --strategy ddp or fsdp"),
        ({"strategy": "ddp", "model": "ctr-tiny"}, "trains with --strategy ps"),
        ({"strategy": "ps", "model": "ctr-tiny", "staleness": -2}, "--staleness=-2"),
        ({"strategy": "ps", "model": "ctr-tiny", "ps_servers_per_node": 0}, "--ps-servers-per-node=0"),
        ({"strategy": "ps", "model": "ctr-tiny", "seq_len": 64}, "not used by --strategy ps"),
    ],
)
def test_the_sparse_models_settings_are_refused_in_one_line(tmp_path, changes, words):
    with pytest.raises(UsageError) as err:
        TrainConfig(data=str(tmp_path), checkpoint_dir=str(tmp_path / "c"), max_steps=1, **changes)
    assert words in str(err.value)


def test_sharded_rows_read_back_as_the_whole_table_would_give_them():
    # Validation and --init-from read every server's shard (rows r % servers) where a batch needs them.
    from efa_training.workloads.ctr_ps.evaluate import ShardedTable

    full = torch.randn(1000, 4)
    table = ShardedTable([full[g::3] for g in range(3)])
    rows = torch.randint(0, 1000, (7, 26))
    assert torch.equal(table[rows], full[rows])
    accum = ShardedTable([full[g::3, 0] for g in range(3)])
    assert torch.equal(accum[torch.arange(2, 1000, 5)], full[2::5, 0])

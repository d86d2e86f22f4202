"""data.py: the shard format and the data position."""

import numpy as np
import pytest

from efa_training.runtime.errors import UsageError
from efa_training.workloads.gpt import data


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

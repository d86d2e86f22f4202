"""Stragglers named during training (efa_training/runtime/stragglers.py): at each metrics line every rank times a
fixed matmul on its device and its wait for batches, and rank 0's line carries the slowest device over the median
(`StragglerRatio`, which the <prefix>-straggler alarm watches), the longest input wait, and the slowest rank and its
host. For real on 2 processes (gloo), one of them slowed."""

import socket

import pytest

from tests.training import training_helpers as th

pytestmark = pytest.mark.slow  # real torchrun processes

SLOW_MS = 200  # rank 1's device probe takes 200 ms longer; a healthy probe on this CPU takes well under 5 ms
# With two ranks the median is their mean, so the slowest over the median stays under 2: 200 ms against even 20 ms
# for a healthy probe on a loaded machine is 1.82.
SLOWED_RATIO = 1.5


def test_a_slowed_rank_is_named_with_its_host_on_every_metrics_line(dataset, tmp_path):
    run = th.torchrun("train.py", th.train_args(dataset, tmp_path / "ckpt", steps=4, every=4), nproc=2,
                      STRAGGLER_TEST_SLOW_RANK=f"1:{SLOW_MS}")  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [line for line in run.emf() if "Loss" in line]
    assert len(lines) == 4, lines
    for line in lines:
        assert line["StragglerRatio"] > SLOWED_RATIO and line["SlowestRank"] == 1, line
        assert line["SlowestHost"] == socket.gethostname() and line["DataWaitSeconds"] >= 0
    metrics = {m["Name"] for m in lines[0]["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert {"StragglerRatio", "DataWaitSeconds"} <= metrics and "SlowestHost" not in metrics  # a property, no metric

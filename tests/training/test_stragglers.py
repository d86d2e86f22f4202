"""Stragglers named during training (efa_training/runtime/stragglers.py): at each metrics line every rank times a
fixed matmul on its device and its wait for batches, and rank 0's line carries the slowest device over the median
(`StragglerRatio`, which the <prefix>-straggler alarm watches), the longest input wait, and the slowest rank and its
host. For real on 2 processes (gloo), one of them slowed."""

import json
import socket

import pytest

from tests.training import training_helpers as th

pytestmark = pytest.mark.slow  # real torchrun processes

SLOW_MS = 200  # rank 1's device probe takes 200 ms longer; a healthy probe on this CPU takes well under 5 ms
# With two ranks the median is their mean, so the slowest over the median stays under 2: 200 ms against even 20 ms
# for a healthy probe on a loaded machine is 1.82.
SLOWED_RATIO = 1.5


@pytest.fixture(scope="module")
def slowed(dataset, tmp_path_factory):
    """4 steps on 2 ranks, rank 1 slowed; a straggler is one from its second line on (persistence 0 s), recorded
    under a local REPORT_PREFIX."""
    tmp_path = tmp_path_factory.mktemp("slowed")
    run = th.torchrun("train.py", th.train_args(dataset, tmp_path / "ckpt", steps=4, every=4), nproc=2,
                      STRAGGLER_TEST_SLOW_RANK=f"1:{SLOW_MS}", STRAGGLER_PERSIST_SECONDS="0",
                      REPORT_PREFIX=str(tmp_path / "runs"), RUN_ID="slowed-run")  # fmt: skip
    return run, tmp_path / "runs"


def test_a_rank_that_stays_a_straggler_is_recorded_as_a_bad_host(slowed):
    # The host the pipeline takes out before the run's next attempt (runtime/bad_hosts.py), named once.
    run, runs = slowed
    assert run.returncode == 0, run.stderr[-3000:]
    (found,) = (runs / "slowed-run/bad-hosts/pending").iterdir()
    assert found.name == socket.gethostname()
    recorded = json.loads(found.read_text())
    assert recorded["why"].startswith("a straggler") and recorded["evidence"][0].startswith("rank 1 on ")


def test_a_slowed_rank_is_named_with_its_host_on_every_metrics_line(slowed):
    run, _ = slowed
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [line for line in run.emf() if "Loss" in line]
    assert len(lines) == 4, lines
    for line in lines:
        assert line["StragglerRatio"] > SLOWED_RATIO and line["SlowestRank"] == 1, line
        assert line["SlowestHost"] == socket.gethostname() and line["DataWaitSeconds"] >= 0
    # the same rank the slowest from the first line on: its time held only grows (the straggler alarm's metric)
    held = [line["StragglerPersistSeconds"] for line in lines]
    assert held[0] == 0 and held == sorted(held) and held[-1] > 0, held
    metrics = {m["Name"] for m in lines[0]["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert {"StragglerRatio", "DataWaitSeconds", "StragglerPersistSeconds"} <= metrics and "SlowestHost" not in metrics

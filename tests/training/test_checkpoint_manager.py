"""checkpoint_manager.py: the steps it saves at, and the Young/Daly interval it derives from the first save."""

import math
import re

import pytest

from efa_training.checkpointing.schedule import FIRST_AUTO_SAVE, SaveSchedule, young_daly_steps
from tests.training import training_helpers as th


def _save_steps(schedule: SaveSchedule, steps: range, stop_at: int | None = None) -> list[int]:
    return [s for s in steps if schedule.due(s, stopping=s == stop_at)]


def test_a_fixed_interval_saves_every_k_steps_and_at_the_last_step():
    assert _save_steps(SaveSchedule(5, max_steps=12), range(1, 13)) == [5, 10, 12]


def test_a_stop_request_saves_at_the_step_it_arrives():
    assert _save_steps(SaveSchedule(5, max_steps=12), range(1, 13), stop_at=7) == [5, 7, 10, 12]


def test_a_fixed_interval_is_never_measured():
    assert not SaveSchedule(5, max_steps=100).measures_at(5, stopping=False, saves_so_far=0)


def test_the_default_saves_first_at_the_measuring_step_then_at_the_measured_interval():
    schedule = SaveSchedule(0, max_steps=100)
    assert _save_steps(schedule, range(1, FIRST_AUTO_SAVE + 1)) == [FIRST_AUTO_SAVE]
    assert schedule.measures_at(FIRST_AUTO_SAVE, stopping=False, saves_so_far=0)
    schedule.every = 30
    assert _save_steps(schedule, range(FIRST_AUTO_SAVE + 1, 101)) == [30, 60, 90, 100]
    assert not schedule.measures_at(30, stopping=False, saves_so_far=1)  # measured once per process


def test_neither_a_stop_nor_the_last_step_is_measured():
    # Their save's barrier must stay the last collective before the process group is torn down.
    schedule = SaveSchedule(0, max_steps=FIRST_AUTO_SAVE)
    assert not schedule.measures_at(FIRST_AUTO_SAVE, stopping=False, saves_so_far=0)
    assert not SaveSchedule(0, max_steps=100).measures_at(7, stopping=True, saves_so_far=0)


def test_young_daly_interval_is_sqrt_of_twice_the_save_time_the_mtbf():
    # 0.5 s per save, 1 h MTBF: sqrt(2 x 0.5 x 3600) = 60 s, 120 steps of 0.5 s.
    assert young_daly_steps(0.5, 0.5, 1.0) == (120, pytest.approx(60.0))
    assert young_daly_steps(1e-6, 100.0, 1e-3)[0] == 1  # never less than every step


@pytest.mark.slow
def test_default_interval_is_young_daly_from_the_first_save(dataset, tmp_path):
    # --checkpoint-every 0: save at step 20, measure, then every sqrt(2 * C * MTBF) / step time steps.
    run = th.single_process(
        "train.py",
        [*th.train_args(dataset, tmp_path, steps=26, every=0), "--mtbf-hours", "0.0001", "--keep-last", "100"],
    )
    found = re.search(
        r"checkpoint: every (\d+) steps \(Young/Daly: sqrt\(2 x (\S+) s per save x (\S+) h MTBF\) = \S+ s at (\S+) s",
        run.stderr,
    )
    assert run.returncode == 0 and found, run.stderr[-2000:]
    k, save_s, mtbf_h, step_s = int(found.group(1)), *map(float, found.group(2, 3, 4))
    # The interval is the formula of the figures the run measured, recomputed here (not read back), and the step
    # time it used is the median of the steps its own metric lines report (the first, a warm-up, left out).
    ratio = math.sqrt(2 * save_s * mtbf_h * 3600) / step_s  # from figures logged to 3 digits: 0.2% of slack
    assert mtbf_h == 0.0001 and abs(k - max(1.0, ratio)) <= 0.5 + 0.002 * ratio, (ratio, found.group(0))
    step_times = sorted(r["StepTimeSeconds"] for r in run.emf() if 1 < r["Step"] <= 20)
    assert step_s == pytest.approx(step_times[len(step_times) // 2], rel=0.01), (step_s, step_times)
    assert th.checkpoint_steps(tmp_path) == sorted({20, 26} | {s for s in range(21, 27) if s % k == 0})

"""divergence.py: what counts as diverged (the whole run stopping and being refused again: test_training_guards)."""

import pytest

from efa_training.runtime.divergence import why_diverged


@pytest.mark.parametrize(
    "loss, norm, lowest, expected",
    [
        (float("nan"), 1.0, 2.0, "loss nan"),
        (2.0, float("inf"), 2.0, "gradient norm inf"),
        (25.0, 1.0, 2.0, "more than 10 times its lowest value 2"),
        (19.0, 1.0, 2.0, None),
        (6.0, 1.0, float("inf"), None),  # the first step has nothing to compare with
    ],
)
def test_divergence_is_a_non_finite_loss_or_norm_or_a_spike(loss, norm, lowest, expected):
    reason = why_diverged(loss, norm, lowest, 10.0)
    assert (reason is None) if expected is None else (reason is not None and expected in reason), reason

"""validate.py's verdict, without a model (evaluating real checkpoints: test_training_validate)."""

import json

import pytest

from efa_training import validate


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_verdict_for_a_diverged_model_is_strict_json_and_rejected(value):
    # The pipeline's States.StringToJson needs strict JSON: no NaN/Infinity, and the model must not pass.
    doc = json.loads(json.dumps(validate.verdict(value, 2.0, 0.001), allow_nan=False))
    assert (doc["passed"], doc["value"], doc["perplexity"], doc["delta"]) == (False, None, None, None)


def test_perplexity_of_a_huge_finite_loss_does_not_overflow():
    # math.exp overflows above ~709.78; the verdict must still be written (and reject the model).
    doc = validate.verdict(800.0, 2.0, 0.001)
    assert (doc["passed"], doc["value"], doc["perplexity"]) == (False, 800.0, None)


def test_acceptance_rule_is_relative_tolerance_on_lower_is_better():
    assert validate.verdict(1.0009, 1.0, 0.001)["passed"] is True
    assert validate.verdict(1.0011, 1.0, 0.001)["passed"] is False
    assert validate.verdict(0.9, 1.0, 0.001)["passed"] is True

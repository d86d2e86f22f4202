"""The run contract (contracts/run.py) against the training image it describes, and its stage timeouts."""

from dataclasses import fields

import pytest

from contracts.run import (MODELS, QUEUE_WAIT_MINUTES, STRATEGIES, defaults, execution_seconds, stages,
                           train_state_seconds, validate_run)


def test_models_and_strategies_are_the_training_images_own():
    from model import MODEL_SIZES
    from train import STRATEGIES as IMAGE_STRATEGIES

    assert MODELS == tuple(MODEL_SIZES) and STRATEGIES == IMAGE_STRATEGIES


def test_hyperparameter_defaults_are_the_training_configs():
    from train import TrainConfig

    image = {f.name: f.default for f in fields(TrainConfig)}
    hyper = defaults(max_nodes=2)["hyperparameters"]
    assert {k: hyper[k] for k in ("checkpoint_every", "seed", "strategy", "model", "lr")} == {
        k: image[k] for k in ("checkpoint_every", "seed", "strategy", "model", "lr")}
    assert hyper["batch_size"] == image["micro_batch_size"]
    assert hyper["max_steps"] >= 1  # required by the image; the contract gives the job definitions' default  # --batch-size is the micro-batch per worker


def test_each_stage_waits_for_every_attempt_and_its_queue_wait():
    # Issue 11: the Train state covers every Batch attempt a submission allows, and follows the attempt timeout.
    table = stages(train_attempt_hours=24)
    assert table["train"].attempt_seconds == 24 * 3600
    per_attempt = 24 * 3600 + QUEUE_WAIT_MINUTES * 60
    assert train_state_seconds(24)[1:] == [n * per_attempt for n in range(1, 11)]
    assert table["sanity"].state_seconds() == table["sanity"].attempts * (3600 + QUEUE_WAIT_MINUTES * 60)


def test_the_execution_outlasts_its_stages_within_the_one_year_quota():
    long = execution_seconds(720, sanity_submissions=2, train_submissions=4, train_backoff_seconds=5400,
                             calls_seconds=3600)
    assert long == 365 * 24 * 3600  # capped: Standard workflows run at most a year
    short = execution_seconds(1, sanity_submissions=2, train_submissions=4, train_backoff_seconds=5400,
                              calls_seconds=3600)
    assert short >= 4 * train_state_seconds(1)[-1] + 2 * stages(1)["sanity"].state_seconds()


@pytest.mark.parametrize("run", [None, [], "x", 1.5, {"run_id": 1e400}, {"baseline": float("nan")},
                                 {"hyperparameters": {"seed": 10**5000}}, {"nodes": float("-inf")}])
def test_validate_run_never_raises(run):
    assert validate_run(run, max_nodes=2)  # problems, never an exception


def test_refused_exit_codes_are_the_training_images():
    # The pipeline does not retry a run that refused itself (constructs/pipeline/train_attempt.py): the codes it
    # matches are the ones the image exits with.
    import errors
    from contracts.run import REFUSED_EXIT_CODES
    assert set(REFUSED_EXIT_CODES) == {errors.EXIT_USAGE, errors.EXIT_DIVERGED, errors.EXIT_FOLDER_LOCKED}

"""The run contract (contracts/run.py) against the training image it describes, and its stage timeouts."""

from dataclasses import MISSING, fields
from typing import Any

import pytest

from contracts.run import (
    QUEUE_WAIT_MINUTES,
    execution_seconds,
    stages,
    train_state_seconds,
    validate_run,
)
from contracts.run import fields as contract_fields
from contracts.workload import built_in_workloads

# The TrainConfig field each contract hyperparameter sets (--batch-size is the micro-batch per worker).
IMAGE_FIELD = {"batch_size": "micro_batch_size"}
BUILT_IN = {w.name: w for w in built_in_workloads()}
# Every built-in trainer's hyperparameters (training_image/efa_training/workloads/<name>/workload.json), by name: the
# ones both declare are the same train.py flag, with the same rule.
HYPERPARAMETERS = {f.key: f for w in BUILT_IN.values() for f in w.hyperparameters}


def _choices(workload: str, key: str) -> tuple[str, ...]:
    return next(f.choices for f in BUILT_IN[workload].hyperparameters if f.key == key)


def test_the_built_in_declarations_models_are_the_training_images_sizes():
    from efa_training.workloads.ctr_ps.model import CTR_SIZES
    from efa_training.workloads.gpt.model import MODEL_SIZES

    assert _choices("gpt", "model") == tuple(MODEL_SIZES) and _choices("ctr-ps", "model") == tuple(CTR_SIZES)


def test_each_built_in_declaration_trains_with_its_own_workloads_strategies():
    # The image picks its trainer by --strategy (workloads.workload_for): each declaration's strategies pick it.
    from efa_training import workloads
    from efa_training.train_config import STRATEGIES

    for name in BUILT_IN:
        assert {workloads.workload_for(s) for s in _choices(name, "strategy")} == {name}
    assert {s for name in BUILT_IN for s in _choices(name, "strategy")} == set(STRATEGIES)


def test_the_built_in_declarations_are_run_by_the_platform_on_its_image():
    for workload in BUILT_IN.values():
        assert workload.platform and workload.image_directory is workload.image_uri is None


def test_both_built_in_declarations_give_a_shared_hyperparameter_the_same_rule():
    shared = {f.key for f in BUILT_IN["gpt"].hyperparameters} & {f.key for f in BUILT_IN["ctr-ps"].hyperparameters}
    by_key = {w: {f.key: f for f in BUILT_IN[w].hyperparameters} for w in BUILT_IN}
    assert shared >= {"max_steps", "seed", "lr", "batch_size", "checkpoint_every"}
    for key in shared - {"model", "strategy"}:
        assert by_key["gpt"][key] == by_key["ctr-ps"][key]


def test_the_unbounded_staleness_is_the_training_images():
    from efa_training.train_config import UNBOUNDED

    assert HYPERPARAMETERS["staleness"].minimum == UNBOUNDED


def test_every_hyperparameter_is_a_training_config_field():
    from efa_training.train_config import TrainConfig

    assert {IMAGE_FIELD.get(key, key) for key in HYPERPARAMETERS} <= {f.name for f in fields(TrainConfig)}


@pytest.mark.parametrize("key", sorted(set(HYPERPARAMETERS) - {"max_steps", "model", "strategy"}))
def test_hyperparameter_default_is_the_training_configs(key):
    # The image cannot import contracts/ (its build context is training_image/): the two defaults are held equal.
    from efa_training.train_config import TrainConfig

    image = {f.name: f.default for f in fields(TrainConfig)}
    assert HYPERPARAMETERS[key].default == image[IMAGE_FIELD.get(key, key)]


def test_the_default_workloads_model_and_strategy_are_the_training_configs():
    from contracts.run import DEFAULT_WORKLOAD
    from efa_training.train_config import TrainConfig

    image = {f.name: f.default for f in fields(TrainConfig)}
    declared = {f.key: f.default for f in BUILT_IN[DEFAULT_WORKLOAD].hyperparameters}
    assert (declared["model"], declared["strategy"]) == (image["model"], image["strategy"])


def test_max_steps_has_no_image_default_and_the_contracts_is_accepted():
    # train.py requires --max-steps (no default to disagree with); the job definitions pass the contract's.
    from efa_training.train_config import TrainConfig

    contract = HYPERPARAMETERS["max_steps"].default
    assert next(f for f in fields(TrainConfig) if f.name == "max_steps").default is MISSING
    assert isinstance(contract, int) and TrainConfig(data="d", checkpoint_dir="c", max_steps=contract).max_steps >= 1


@pytest.mark.parametrize("key", sorted(k for k, f in HYPERPARAMETERS.items() if f.kind in ("integer", "number")))
def test_the_contracts_limits_are_values_the_training_config_accepts(key):
    # Every value the state machine lets through must start training, not fail on the nodes with exit 2.
    from efa_training.train_config import TrainConfig

    f = HYPERPARAMETERS[key]
    limits = [f.maximum] + ([] if f.exclusive_minimum else [f.minimum])
    for value in limits:
        assert value is not None
        limit = int(value) if f.kind == "integer" else value
        # With the companions its relations need (a declaration's requires and divides), as a run would give them.
        hyper: dict[str, Any] = {key: limit, **{other: allowed[0] for other, allowed in f.requires}}
        if f.divides is not None:
            hyper[f.divides[0]] = next(choice for choice, n in f.divides[1] if n % limit == 0)
        workload = next(name for name, w in BUILT_IN.items() if key in {g.key for g in w.hyperparameters})
        run = {"run_id": "r1", "dataset": "datasets/d/", "workload": workload, "hyperparameters": hyper}
        assert validate_run(run, max_nodes=2) == []  # the state machine lets it through
        given = {IMAGE_FIELD.get(k, k): v for k, v in hyper.items()}
        TrainConfig(data="d", checkpoint_dir="c", **{"max_steps": 1, **given})  # raises UsageError if not


def test_validation_tolerance_default_is_the_contracts():
    from efa_training import validate

    tolerance = next(f for f in contract_fields(max_nodes=2) if f.name == "tolerance")
    assert validate.build_parser().get_default("tolerance") == validate.DEFAULT_TOLERANCE == tolerance.default
    assert tolerance.minimum is not None and tolerance.maximum is not None
    for value in (tolerance.minimum, tolerance.maximum):  # validate.py accepts the contract's whole range
        assert validate.check_flags(validate.parse_args(["--tolerance", str(value)]))


def test_each_stage_waits_for_every_attempt_and_its_queue_wait():
    # Issue 11: the Train state covers every Batch attempt a submission allows, and follows the attempt timeout.
    table = stages(train_attempt_hours=24)
    assert table["train"].attempt_seconds == 24 * 3600
    per_attempt = 24 * 3600 + QUEUE_WAIT_MINUTES * 60
    assert train_state_seconds(24)[1:] == [n * per_attempt for n in range(1, 11)]
    assert table["sanity"].state_seconds() == table["sanity"].attempts * (3600 + QUEUE_WAIT_MINUTES * 60)


def test_the_execution_outlasts_its_stages_within_the_one_year_quota():
    long = execution_seconds(
        720, sanity_submissions=2, train_submissions=4, train_backoff_seconds=5400, calls_seconds=3600
    )
    assert long == 365 * 24 * 3600  # capped: Standard workflows run at most a year
    short = execution_seconds(
        1, sanity_submissions=2, train_submissions=4, train_backoff_seconds=5400, calls_seconds=3600
    )
    assert short >= 4 * train_state_seconds(1)[-1] + 2 * stages(1)["sanity"].state_seconds()


@pytest.mark.parametrize(
    "run",
    [
        None,
        [],
        "x",
        1.5,
        {"run_id": 1e400},
        {"baseline": float("nan")},
        {"hyperparameters": {"seed": 10**5000}},
        {"nodes": float("-inf")},
    ],
)
def test_validate_run_never_raises(run):
    assert validate_run(run, max_nodes=2)  # problems, never an exception


def test_refused_exit_codes_are_the_training_images():
    # The pipeline does not retry a run that refused itself (constructs/pipeline/train_attempt.py): the codes it
    # matches are the ones the image exits with.
    from contracts.run import REFUSED_EXIT_CODES
    from efa_training.runtime import errors

    assert set(REFUSED_EXIT_CODES) == {errors.EXIT_USAGE, errors.EXIT_DIVERGED, errors.EXIT_FOLDER_LOCKED}


def test_failure_reason_marker_is_the_training_images():
    # The pipeline matches the marker in a SageMaker job's FailureReason; the image writes it (errors.failure_reason).
    from contracts.run import FAILURE_REASON_MARKER
    from efa_training.runtime import errors

    assert errors.FAILURE_REASON_MARKER == FAILURE_REASON_MARKER


def test_sagemaker_hyperparameters_are_the_job_parameters():
    # launch.py turns SageMaker's hyperparameters into flags and refuses unknown ones: the names the pipeline passes.
    from contracts.run import JOB_PARAMETERS
    from efa_training.runtime.launch import sagemaker

    expected = {job: set(names) for job, names in JOB_PARAMETERS.items()}
    expected["train"].add("expected_nodes")
    expected["compile"].add("expected_nodes")  # Trainium's compile job runs on the run's nodes too
    assert {job: set(names) for job, names in sagemaker.SAGEMAKER_HYPERPARAMETERS.items()} == expected


def test_a_declared_workloads_sagemaker_hyperparameters_are_its_job_parameters():
    from contracts.run import WORKLOAD_JOB_PARAMETERS
    from efa_training.runtime.launch import sagemaker

    expected = {job: set(WORKLOAD_JOB_PARAMETERS[job]) for job in ("train", "validate")}
    expected["train"].add("expected_nodes")
    assert {job: set(names) for job, names in sagemaker.WORKLOAD_HYPERPARAMETERS.items()} == expected


def test_a_declared_workloads_gate_defaults_to_the_contracts_tolerance():
    from efa_training.runtime import user_validate

    assert next(f.default for f in contract_fields(2) if f.name == "tolerance") == user_validate.DEFAULT_TOLERANCE


def test_the_images_metrics_namespace_is_the_one_the_dashboard_alarms_and_jobs_role_read():
    # Loaded from its file: a plain `import metrics` may find tests/observability/metrics.py in the same session.
    import importlib.util
    from pathlib import Path

    from config.layout import TRAINING_METRICS_NAMESPACE

    path = Path(__file__).resolve().parents[2] / "training_image" / "efa_training" / "runtime" / "metrics.py"
    spec = importlib.util.spec_from_file_location("image_metrics", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.NAMESPACE == TRAINING_METRICS_NAMESPACE


@pytest.mark.parametrize("dockerfile", ["Dockerfile.gpu", "Dockerfile.neuron"])
def test_sagemaker_jobs_start_the_images_own_entry_point(dockerfile):
    # A SageMaker job replaces the image's ENTRYPOINT with ContainerEntrypoint (API_AlgorithmSpecification): the two
    # must name the same launcher, or every job would start something else.
    import json
    from pathlib import Path

    from constructs.compute.sagemaker.job_runner import ENTRYPOINT

    text = (Path(__file__).resolve().parents[2] / "training_image" / dockerfile).read_text()
    (line,) = [line for line in text.splitlines() if line.startswith("ENTRYPOINT ")]
    assert tuple(json.loads(line[len("ENTRYPOINT ") :])) == ENTRYPOINT


def test_the_image_and_the_pipeline_name_from_scratch_alike():
    # The train job's --init-from when a run has no initial model (constructs/pipeline/initial_model.py sets it).
    from contracts.run import NO_INITIAL_MODEL
    from efa_training import train_config

    assert (
        train_config.NO_INITIAL_MODEL
        == NO_INITIAL_MODEL
        == train_config.TrainConfig.__dataclass_fields__["init_from"].default
    )


def test_the_gpt_tensor_parallel_degree_divides_each_sizes_heads():
    # The declaration's table (what the CLI and the first state judge) is the training image's own (sizes.py).
    from efa_training.workloads.gpt.sizes import MODEL_SIZES

    degree = next(f for f in BUILT_IN["gpt"].hyperparameters if f.key == "tensor_parallel")
    assert degree.divides is not None and dict(degree.divides[1]) == {n: c.n_head for n, c in MODEL_SIZES.items()}
    assert degree.requires == (("strategy", ("fsdp",)),)


def test_the_gpt_pipeline_parallel_degree_divides_each_sizes_layers():
    # As the heads above: the declaration's table of layers is sizes.py's, so a run the trainer would refuse
    # (train_config: a degree that does not divide the layers) is refused at the CLI and the first state.
    from efa_training.workloads.gpt.sizes import MODEL_SIZES

    degree = next(f for f in BUILT_IN["gpt"].hyperparameters if f.key == "pipeline_parallel")
    assert degree.divides is not None and dict(degree.divides[1]) == {n: c.n_layer for n, c in MODEL_SIZES.items()}
    assert degree.requires == (("strategy", ("fsdp",)),) and degree.layout == "run"
    assert next(f for f in BUILT_IN["gpt"].hyperparameters if f.key == "tensor_parallel").layout == "node"

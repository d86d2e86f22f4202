"""The docs state run facts that live in code; each table is held to its source, so neither can drift."""

import json
import re
from pathlib import Path

import pytest

from config import efa_instance_types
from config.catalogue import CATALOGUE
from config.environment import EnvironmentConfig
from constructs.compute.backend import MULTI_NODE_JOBS
from constructs.observability.cost_budget import ACTUAL_PERCENTS, FORECASTED_PERCENT
from constructs.pipeline.aws_calls import CALL_TIMEOUT
from constructs.pipeline.training_pipeline import COMPILE_RETRIES, SANITY_RETRIES, TrainingRetry
from contracts.eks.job_templates import indexed_job
from contracts.job_environment import STOP_GRACE_SECONDS, WORKER_SHUTDOWN_SECONDS, job_environment
from contracts.run import (
    CAPACITY_RETRY_MINUTES,
    JOB_END_MARGIN_SECONDS,
    JOB_PARAMETERS,
    PHASES,
    QUEUE_WAIT_MINUTES,
    REFUSED_EXIT_CODES,
    WINDOW_ENDED_EXIT_CODE,
    fields,
    stages,
)
from tools.diagram.states import pipeline_definition

ROOT = Path(__file__).resolve().parent.parent


def _rows(doc: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in (ROOT / doc).read_text().splitlines()
        if line.startswith("| ")
    ]


def _number(text: str) -> float | str:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return text


def test_batch_doc_defaults_are_the_job_definitions(synth):
    # docs/batch.md's job table: every `name=value` default is the synthesized job definition's parameter default.
    definitions = synth().template("compute").find_resources("AWS::Batch::JobDefinition")
    rows = {row[0]: row[2] for row in _rows("docs/batch.md") if row[0] in ("sanity", "train", "validate")}
    assert set(rows) == {"sanity", "train", "validate"}
    for job, cell in rows.items():
        (definition,) = [d for key, d in definitions.items() if f"{job.capitalize()}JobDefinition" in key]
        parameters = definition["Properties"]["Parameters"]
        for name, value in re.findall(r"(\w+)=([^,\s]+)", cell):
            if value.startswith(("`", "<")):  # a symbolic default (`<config nodes>`), named rather than written
                continue
            assert _number(parameters[name]) == _number(value), (job, name)


def test_pipeline_doc_defaults_are_the_run_contract():
    # docs/pipeline.md's input table: each field's default is the run contract's (contracts/run.py).
    documented = {row[0].strip("`"): row[2] for row in _rows("docs/pipeline.md") if row[0].startswith("`")}
    checked = 0
    for field in fields(max_nodes=2):
        literal = isinstance(_number(documented.get(field.name, "")), float)  # `nodes` is named, not written
        if literal and not field.required and field.kind in ("integer", "number"):
            assert _number(documented[field.name]) == float(str(field.default)), field.name
            checked += 1
    assert checked >= 6


def test_batch_doc_bandwidth_thresholds_are_the_catalogues():
    # docs/batch.md names the sanity check's bus-bandwidth gate per instance type; each is the catalogue's.
    text = (ROOT / "docs" / "batch.md").read_text()
    start = text.index("`expected_busbw_gbps`, config/catalogue.py):")
    stated = re.findall(r"([a-z0-9-]+\.\w+) (\d+(?:\.\d+)?)", text[start : text.index("\n-", start)])
    assert len(stated) >= 5
    for instance, gbps in stated:
        assert CATALOGUE[instance].expected_busbw_gbps == float(gbps), instance


# --- file names: a doc cites only files the repository has -------------------------------------------------------

REPO_FOLDERS = (
    "config",
    "contracts",
    "constructs",
    "stacks",
    "training_image",
    "tools",
    "tests",
    "docs",
    "examples",
    "k8s",
)
# Files of other projects that the docs name as their sources, not as files of this repository.
OTHER_PROJECTS_FILES = {"TROUBLESHOOTING.md"}  # PyTorch/XLA's, cited in docs/training_image.md


def test_every_repository_file_a_doc_cites_exists():
    # A path into the repository (`constructs/compute/eks/node_scaling.py`), relative to the root or, for the image's
    # own `benchmarks/...`, to training_image/; and a notes file in capitals (`AWS_FACTS.md`) at the root or in docs/.
    missing = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        text = doc.read_text()
        folders = "|".join(map(re.escape, (*REPO_FOLDERS, "benchmarks")))
        for path in set(re.findall(rf"(?<![\w/.:-])((?:{folders})/[\w./-]*\w)", text)):
            if not any((base / path).exists() for base in (ROOT, ROOT / "training_image")):
                missing.append(f"{doc.name}: {path}")
        for name in set(re.findall(r"\b([A-Z][A-Z_]+\.md)\b", text)) - OTHER_PROJECTS_FILES:
            if not any((base / name).exists() for base in (ROOT, ROOT / "docs")):
                missing.append(f"{doc.name}: {name}")
    assert not missing


def test_training_image_doc_lists_every_module_of_the_image():
    # docs/training_image.md's "Files" table: one row per module of training_image/ and its efa_training package, by
    # its path there, and no row for a module it lacks (benchmarks/ has one row of its own).
    image = ROOT / "training_image"
    listed = {row[0].strip("`") for row in _rows("docs/training_image.md") if re.fullmatch(r"`[\w/]+\.py`", row[0])}
    modules = {path.relative_to(image).as_posix() for path in image.rglob("*.py")}
    assert listed == {module for module in modules if not module.startswith("benchmarks/")}


# --- the stop grace: SIGTERM to SIGKILL, per layer -------------------------------------------------------------------


def _ps_supervisor_grace() -> int:
    # Read from the source: the image's modules import each other by plain name and need torch.
    source = (ROOT / "training_image/efa_training/workloads/ctr_ps/supervisor.py").read_text()
    match = re.search(r"^STOP_GRACE_SECONDS = (\d+)$", source, re.MULTILINE)
    assert match, "training_image/efa_training/workloads/ctr_ps/supervisor.py has no STOP_GRACE_SECONDS"
    return int(match.group(1))


def _seconds(cell: str) -> int:
    match = re.fullmatch(r"(\d+) s", cell)
    assert match, cell
    return int(match.group(1))


def test_stop_grace_table_is_the_code(synth):
    # docs/training_image.md, "Stop grace, per backend": who waits, how long, where it is set.
    rows = {
        row[0]: _seconds(row[1]) for row in _rows("docs/training_image.md") if len(row) == 3 and row[1].endswith(" s")
    }
    by_layer = {
        layer: next(v for k, v in rows.items() if k.startswith(layer)) for layer in ("Batch", "EKS", "SageMaker")
    }
    by_layer["torchrun"] = next(v for k, v in rows.items() if k.startswith("torchrun"))
    by_layer["ps"] = next(v for k, v in rows.items() if "ctr_ps/supervisor.py" in k)
    assert len(rows) == 5
    # Batch: the ECS agent's stop timeout, in the synthesized hosts' user data.
    assert f"ECS_CONTAINER_STOP_TIMEOUT={by_layer['Batch']}s" in json.dumps(synth().raw("compute"))
    assert by_layer["Batch"] == STOP_GRACE_SECONDS
    # EKS: the pods' terminationGracePeriodSeconds.
    pod = indexed_job(CATALOGUE["p5.48xlarge"], image="image", phase="train", nodes=2, name="job")
    assert pod["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == by_layer["EKS"]
    # SageMaker's own 120 s is the grace the constant is sized to (Spot's two minutes).
    assert by_layer["SageMaker"] == STOP_GRACE_SECONDS
    # torchrun's, set on every backend's jobs.
    assert by_layer["torchrun"] == WORKER_SHUTDOWN_SECONDS
    for backend in ("batch", "eks", "sagemaker"):
        environment = job_environment(CATALOGUE["p5.48xlarge"], backend=backend)
        assert environment["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == str(by_layer["torchrun"])
    assert by_layer["ps"] == _ps_supervisor_grace()


def test_every_stop_grace_the_docs_state_is_the_code():
    # (doc, where the number stands, the code's number): each pattern must be found, and say the code's number.
    claims = [
        (
            "training_image.md",
            r"`TORCH_ELASTIC_SHUTDOWN_TIMEOUT` \| sanity, train \| set by every backend \((\d+)\)",
            WORKER_SHUTDOWN_SECONDS,
        ),
        ("training_image.md", r"(\d+) s for torchrun's workers", WORKER_SHUTDOWN_SECONDS),
        ("training_image.md", r"against (\d+) s for a new model size", WORKER_SHUTDOWN_SECONDS),
        ("training_image.md", r"within the\s+container's (\d+) s", STOP_GRACE_SECONDS),
        ("training_image.md", r"inside the container's (\d+) s", STOP_GRACE_SECONDS),
        ("training_image.md", r"send SIGTERM and allow (\d+) s", STOP_GRACE_SECONDS),
        ("training_image.md", r"waits up to (\d+) s for it", _ps_supervisor_grace()),
        ("batch.md", r"ECS_CONTAINER_STOP_TIMEOUT=(\d+)s", STOP_GRACE_SECONDS),
        ("eks.md", r"gets SIGTERM and (\d+) s \(`terminationGracePeriodSeconds`", STOP_GRACE_SECONDS),
        ("sagemaker.md", r"StopTrainingJob sends SIGTERM and\s+waits (\d+) s", STOP_GRACE_SECONDS),
    ]
    for doc, pattern, seconds in claims:
        found = re.findall(pattern, (ROOT / "docs" / doc).read_text())
        assert found and all(int(number) == seconds for number in found), (doc, pattern, found)


# --- timeouts and retries -------------------------------------------------------------------------------------------


def _find(doc: str, pattern: str) -> tuple[str, ...]:
    match = re.search(pattern, (ROOT / "docs" / doc).read_text())
    assert match, (doc, pattern)
    return match.groups()


def test_the_exit_codes_docs_workloads_states_are_the_run_contracts():
    # docs/workloads.md, "The platform asks", exit codes: the codes that end the run are the pipeline's refusals, and
    # the reservation's is the window's; every other code is stated as retried.
    refused = _find("workloads.md", r"(\d+) the input is wrong, (\d+) the loss diverged, (\d+) another job writes")
    assert {int(code) for code in refused} == set(REFUSED_EXIT_CODES)
    assert "(these three end the run: not retried)" in (ROOT / "docs" / "workloads.md").read_text()
    assert len(REFUSED_EXIT_CODES) == 3
    (window,) = _find("workloads.md", r"(\d+) stopped before the reservation ends")
    assert int(window) == WINDOW_ENDED_EXIT_CODE
    hung, stopped = _find("workloads.md", r"(\d+) \(hung\) and (\d+) \(stopped on SIGTERM\) included")
    (unprepared,) = _find("workloads.md", r"and (\d+), which the platform's launcher ends a job with on a Batch host")
    assert {int(hung), int(stopped), int(unprepared)}.isdisjoint({*REFUSED_EXIT_CODES, WINDOW_ENDED_EXIT_CODE})


def test_stage_timeouts_the_docs_state_are_the_run_contracts():
    default_hours = EnvironmentConfig.batch_train_timeout_hours  # the dataclass field's default
    table = stages(default_hours)
    hours = {job: stage.attempt_seconds / 3600 for job, stage in table.items()}
    # docs/pipeline.md, Retries, "Timeouts".
    sanity, train, validate = _find(
        "pipeline.md", r"sanity (\d+) h, train `batch_train_timeout_hours` \((\d+) h by default\), validate (\d+) h"
    )
    assert (float(sanity), float(train), float(validate)) == (hours["sanity"], default_hours, hours["validate"])
    assert hours["train"] == default_hours
    (wait,) = _find("pipeline.md", r"may first wait up to (\d+) min for capacity")
    assert int(wait) == QUEUE_WAIT_MINUTES
    state_waits = _find(
        "pipeline.md", r"sanity (\d+) × \((\d+) h \+ (\d+) min\), validate (\d+) × \((\d+) h \+ (\d+) min\)"
    )
    for job, (attempts, attempt_hours, minutes) in zip(
        ("sanity", "validate"), (state_waits[:3], state_waits[3:]), strict=True
    ):
        assert int(attempts) == table[job].attempts
        assert float(attempt_hours) == hours[job] and int(minutes) == QUEUE_WAIT_MINUTES
        assert table[job].state_seconds() == int(attempts) * (float(attempt_hours) * 3600 + int(minutes) * 60)
    (compile_hours,) = _find("pipeline.md", r"one (\d+)-hour attempt after\s+the capacity wait")
    assert float(compile_hours) == hours["compile"] and table["compile"].attempts == 1
    # docs/batch.md: the job definitions' attempts and timeouts.
    assert tuple(map(int, _find("batch.md", r"attempts: sanity (\d+), train (\d+), validate (\d+)"))) == tuple(
        table[job].attempts for job in ("sanity", "train", "validate")
    )
    sanity, train, validate = _find(
        "batch.md", r"Timeouts: sanity (\d+) h, train `batch_train_timeout_hours` \((\d+)\), validate (\d+) h"
    )
    assert (float(sanity), int(train), float(validate)) == (hours["sanity"], default_hours, hours["validate"])
    # A job that ends itself: one attempt plus this long (EKS activeDeadlineSeconds, SageMaker MaxWaitTimeInSeconds).
    beyond_attempt = (table["train"].deadline_seconds - table["train"].attempt_seconds) // 60
    (eks_minutes,) = _find("eks.md", r"`activeDeadlineSeconds` = one attempt's timeout \+ (\d+) minutes")
    (sagemaker_minutes,) = _find(
        "sagemaker.md", r"`MaxWaitTimeInSeconds` = the runtime \+ (\d+) minutes \+ `capacity_wait_hours`"
    )
    assert int(eks_minutes) == int(sagemaker_minutes) == beyond_attempt
    (margin,) = _find("sagemaker.md", r"the Spot job's state waits MaxWait \+ (\d+) minutes")
    assert int(margin) == JOB_END_MARGIN_SECONDS // 60


def test_retries_the_pipeline_doc_states_are_the_constructs():
    retry = TrainingRetry()
    interval, backoff, max_delay, attempts = _find(
        "pipeline.md",
        r"`IntervalSeconds` (\d+),\s+`BackoffRate` (\d+), `MaxDelaySeconds` (\d+), `JitterStrategy: FULL`,"
        r" `MaxAttempts` (\d+)",
    )
    assert (int(interval), float(backoff), int(max_delay), int(attempts)) == (
        retry.interval.to_seconds(),
        retry.backoff_rate,
        retry.max_delay.to_seconds(),
        retry.max_attempts,
    )
    (every,) = _find("pipeline.md", r"is asked again every (\d+) minutes, apart from the attempts above")
    assert int(every) == CAPACITY_RETRY_MINUTES
    (call_minutes,) = _find("pipeline.md", r"S3/SSM/SNS/Step Functions call (\d+) min")
    assert int(call_minutes) == CALL_TIMEOUT.to_minutes()
    sanity = r"\*\*Sanity check\*\*: a one-branch Parallel like `Train` \(below\): (one) Retry of `TrainingAttempt"
    assert _find("pipeline.md", sanity) == ("one",) and SANITY_RETRIES == 1
    assert (
        COMPILE_RETRIES == 1 and "one Retry of `TrainingAttemptFailed`" in (ROOT / "docs" / "pipeline.md").read_text()
    )


# --- the pipeline's states, errors and job parameters ---------------------------------------------------------------


@pytest.fixture(scope="module")
def machines(synth) -> list[dict]:
    """The pipeline's definition on every backend (prod, the pictures' environment) and on Trainium (Compile)."""
    variants = [{"env": "prod", "compute": c} for c in ("batch", "eks", "sagemaker")]
    variants.append({"compute": "batch", "instance_type": "trn1.32xlarge"})
    return [pipeline_definition(synth(**variant).raw("pipeline")) for variant in variants]


def _all_states(machine: dict) -> dict[str, dict]:
    found = {}
    for name, body in machine["States"].items():
        found[name] = body
        for branch in body.get("Branches", []) + [b for b in (body.get("ItemProcessor"), body.get("Iterator")) if b]:
            found.update(_all_states(branch))
    return found


def _failure_errors(value: object) -> set[str]:
    """The errors the failure path fails with: every `failure.error` a state sets (FailurePath.record)."""
    if isinstance(value, dict):
        found = (
            {value["failure"]["error"]}
            if isinstance(value.get("failure"), dict) and "error" in value["failure"]
            else set()
        )
        return found.union(*(_failure_errors(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_failure_errors(v) for v in value))
    return set()


def _code_blocks(doc: str) -> list[str]:
    return re.findall(r"^```\n(.*?)^```", (ROOT / "docs" / doc).read_text(), re.MULTILINE | re.DOTALL)


# Words of the diagrams' prose, not states: where a state's name would stand, none of these may.
DIAGRAM_WORDS = {"Fail", "Retry", "Trainium", "Batch", "If", "None", "Match", "ETag", "RUNNING", "JSON"}


def test_pipeline_doc_diagrams_name_states_and_errors_of_the_state_machine(machines):
    # docs/pipeline.md's two diagrams (the pipeline, the initial model): every name in them is a state of the
    # synthesized state machine (on some backend), and every `Fail X` an error the machine fails with.
    states = set().union(*(_all_states(m) for m in machines))
    fail_errors = {
        b["Error"] for m in machines for b in _all_states(m).values() if b["Type"] == "Fail" and "Error" in b
    }
    errors = fail_errors | set().union(*(_failure_errors(m) for m in machines))
    diagrams = _code_blocks("pipeline.md")[:2]
    assert "CheckDataset" in diagrams[0] and "ChooseInitialModel" in diagrams[1]
    names = {
        word for diagram in diagrams for word in re.findall(r"(?<![\w:])[A-Z][A-Za-z0-9]+\b", diagram)
    } - DIAGRAM_WORDS
    unknown = names - states - errors
    assert not unknown, unknown
    failed_with = {name for diagram in diagrams for name in re.findall(r"Fail (\w+)", diagram)}
    failed_with |= {name for diagram in diagrams for name in re.findall(r"Fail \w+ / (\w+)", diagram)}
    assert failed_with and failed_with <= errors, failed_with - errors
    # The phases every successful run passes through, and the new dataset check, are in the diagram.
    assert {"CheckDataset", "ChooseInitialModel", *PHASES} - {"ValidateInput"} <= names | {"ValidateInput"}


def test_pipeline_doc_lists_every_error_of_the_failure_path(machines):
    # docs/pipeline.md, Outcomes: "Any task failing ... → `Fail` with `X`, `Y` ... or `Z`".
    text = (ROOT / "docs" / "pipeline.md").read_text()
    sentence = text[text.index("**Any task failing**") : text.index("A notification that itself fails")]
    listed = set(re.findall(r"`([A-Z][A-Za-z]+)`", sentence.split("→ `Fail` with", 1)[1]))
    assert listed == set().union(*(_failure_errors(m) for m in machines))


def test_pipeline_doc_job_parameters_are_the_run_contracts():
    rows = {row[0].split()[0]: row[2] for row in _rows("docs/pipeline.md") if row[0].split()[0] in JOB_PARAMETERS}
    assert set(rows) == set(JOB_PARAMETERS)
    for job, cell in rows.items():
        if cell == "the train job's":
            assert JOB_PARAMETERS[job] == JOB_PARAMETERS["train"]
            continue
        # Multi-node jobs also get the run's node count (`--expected-nodes`).
        expected = set(JOB_PARAMETERS[job]) | ({"nodes"} if job in MULTI_NODE_JOBS else set())
        named = set(re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", cell)))  # not the notes in brackets
        assert named == expected, (job, cell)


# --- catalogue and configuration defaults ----------------------------------------------------------------------------


def test_training_image_doc_bandwidth_examples_are_the_catalogues():
    text = (ROOT / "docs" / "training_image.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `EXPECTED_BUSBW_GBPS`"))
    stated = re.findall(r"(\d+(?:\.\d+)?) for ([a-z0-9-]+\.\w+)", row)
    assert len(stated) >= 2
    for gbps, instance in stated:
        assert CATALOGUE[instance].expected_busbw_gbps == float(gbps), instance


def test_batch_doc_efa_interfaces_and_validation_types_are_the_catalogues():
    text = (ROOT / "docs" / "batch.md").read_text()
    start = text.index("(`efa_interfaces`:")
    stated = dict(re.findall(r"([a-z0-9-]+\.\w+) (\d+)", text[start : text.index(")", start)]))
    on_batch = {name for name in efa_instance_types() if not CATALOGUE[name].capacity_blocks_only}
    assert set(stated) == on_batch
    assert all(CATALOGUE[name].efa_interfaces == int(count) for name, count in stated.items())
    # "(`validation_instance_type`: g5.xlarge for g5, p5.4xlarge for p4d/p4de/p5/..., ...)": by family.
    start = text.index("(`validation_instance_type`:")
    families = {
        family: validation
        for validation, group in re.findall(r"([a-z0-9-]+\.\w+) for ([\w/-]+)", text[start : text.index(")", start)])
        for family in group.split("/")
    }
    for name in on_batch:
        assert CATALOGUE[name].validation_instance_type == families[name.split(".")[0]], name


def test_observability_doc_defaults_are_the_configs():
    defaults = {name: f.default for name, f in EnvironmentConfig.__dataclass_fields__.items()}
    stated = {
        name: float(value)
        for name, value in re.findall(
            r"`(\w+)` \((\d+(?:\.\d+)?)[,)]", (ROOT / "docs" / "observability.md").read_text()
        )
        if name in defaults
    }
    assert set(stated) >= {"gpu_idle_threshold_percent", "gpu_idle_minutes", "fsx_free_capacity_alarm_percent"}
    assert all(defaults[name] == value for name, value in stated.items()), stated
    actual = re.findall(r"ACTUAL > (\d+) %", (ROOT / "docs" / "observability.md").read_text())
    forecast = re.findall(r"FORECASTED > (\d+) %", (ROOT / "docs" / "observability.md").read_text())
    assert tuple(map(float, actual)) == ACTUAL_PERCENTS and tuple(map(float, forecast)) == (FORECASTED_PERCENT,)


def _outputs(template: dict) -> set[str]:
    """A stack's own outputs (not those CDK adds to hand a value to another stack)."""
    return {name for name in template.get("Outputs", {}) if not name.startswith("PublishOutput")}


def test_stack_outputs_the_docs_list_are_the_templates(synth):
    text = {doc: (ROOT / "docs" / doc).read_text() for doc in ("batch.md", "pipeline.md", "sagemaker.md")}
    batch = text["batch.md"]
    start = batch.index("Stack outputs:")
    listed = batch[start : batch.index("Python attributes:", start)]
    assert set(re.findall(r"`(\w+)`", listed)) - {"batch_single_node_spot"} == _outputs(
        synth(env="prod", compute="batch").raw("compute")
    )
    pipeline = text["pipeline.md"]
    start = pipeline.index("the state machine is the")
    listed = pipeline[start : pipeline.index("the data bucket", start)]
    assert set(re.findall(r"`([A-Z]\w+)`", listed)) == _outputs(synth(env="prod", compute="batch").raw("pipeline"))
    row = next(line for line in text["sagemaker.md"].splitlines() if line.startswith("| Outputs |"))
    assert set(re.findall(r"`(\w+)`", row.split("|")[2])) == _outputs(
        synth(env="prod", compute="sagemaker").raw("compute")
    )

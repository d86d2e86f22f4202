"""Trainium's Compile state, executed in the emulated pipeline on every backend (tests/sfn_emulator.py).

A trn1 environment compiles ahead of time: after the sanity check (Batch, EKS) and before training, a compile job on
the run's nodes fills the shared compile cache (training_image/efa_training/runtime/launch/neuron_compile.py). It has
its own timeout, one retry
of a failed attempt, and a run it refuses (exit 2: bad flags) is not retried; a compile that fails stops the run
before any training instance-hour is spent.
"""

from collections.abc import Callable

import pytest

from contracts.run import stages
from tests.pipeline.runs import ACCEPTED, RUN, cleared, emulated_account, messages, states
from tests.pipeline.test_eks_pipeline import EksEmulator
from tests.pipeline.test_sagemaker_pipeline import SageMakerEmulator
from tests.sfn_emulator import Emulator

TRAINIUM = "trn1.32xlarge"
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("compile-pipeline")]


def _eks_phases(emulator) -> list[str]:
    return [job["spec"]["template"]["spec"]["containers"][0]["args"][0] for job in emulator.jobs]


BACKENDS: dict[str, tuple[type[Emulator], Callable]] = {
    "batch": (Emulator, lambda emulator: emulator.submitted_kinds()),
    "eks": (EksEmulator, _eks_phases),
    "sagemaker": (SageMakerEmulator, lambda emulator: emulator.kinds()),
}


@pytest.fixture(scope="module", params=list(BACKENDS))
def world(request, synth):
    emulator_class, kinds = BACKENDS[request.param]
    synthesized = synth(compute=request.param, instance_type=TRAINIUM)
    with emulated_account(synthesized, emulator_class) as emulator:
        emulator.backend, emulator.job_kinds, emulator.synthesized = request.param, kinds, synthesized
        yield emulator


@pytest.fixture
def emulator(world):
    return cleared(world)


def _expected(emulator, *jobs: str) -> list[str]:
    # SageMaker's training job checks its own hosts: no sanity job there.
    return [job for job in jobs if not (emulator.backend == "sagemaker" and job == "sanity")]


def test_trainium_compiles_on_the_runs_nodes_before_it_trains(emulator):
    emulator.verdict = ACCEPTED
    result = emulator.run(RUN)
    assert result["status"] == "SUCCEEDED", result
    assert emulator.job_kinds(emulator) == _expected(emulator, "sanity", "compile", "train", "validate")


def test_a_failed_compile_is_tried_once_more(emulator):
    emulator.verdict = ACCEPTED
    emulator.outcomes = {"compile": [False, True]}
    result = emulator.run({**RUN, "run_id": "compile-retry"})
    assert result["status"] == "SUCCEEDED", result
    assert emulator.job_kinds(emulator) == _expected(emulator, "sanity", "compile", "compile", "train", "validate")


def test_a_compile_that_keeps_failing_stops_the_run_before_training(emulator):
    emulator.outcomes = {"compile": [False]}
    result = emulator.run({**RUN, "run_id": "compile-fails"})
    assert result["status"] == "FAILED" and result.get("error") == "CompilationFailed", result
    assert "train" not in emulator.job_kinds(emulator)
    assert emulator.job_kinds(emulator).count("compile") == 2
    (alert,) = messages(emulator)
    assert alert["error"] == "CompilationFailed" and alert["state"] == "Compile"


def test_a_compile_that_refuses_the_run_is_not_retried(emulator):
    # Exit 2 (a bad flag, e.g. the compiler's) fails the same way on any hosts: Batch and SageMaker report it, and on
    # EKS the Job's pod failure policy names it in the Job's Failed condition; the pipeline stops at once.
    emulator.outcomes = {"compile": [2]}
    result = emulator.run({**RUN, "run_id": "compile-refused"})
    assert result["status"] == "FAILED" and result.get("error") == "CompilationFailed", result
    assert "exited with 2" in result["cause"]
    assert emulator.job_kinds(emulator).count("compile") == 1


def test_the_compile_state_waits_no_longer_than_its_stage(emulator):
    # contracts.run's compile stage: one 4-hour attempt, after the capacity wait.
    compile_job = states(emulator.synthesized.raw("pipeline"))["Compile"]["Branches"][0]["States"]["CompileJob"]
    assert compile_job["TimeoutSeconds"] == stages(72)["compile"].state_seconds()

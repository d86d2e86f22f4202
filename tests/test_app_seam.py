"""The app's one registry of compute backends and the seam each backend stack implements."""

import importlib

import pytest

from app import COMPUTE_STACKS
from config.environment import COMPUTE_BACKENDS


def test_every_configurable_backend_has_a_stack():
    # `compute` accepts exactly the backends app.py can build: one line per backend in COMPUTE_STACKS.
    assert tuple(COMPUTE_STACKS) == COMPUTE_BACKENDS


def test_every_backend_stack_offers_the_seam(synth):
    # What the pipeline and observability stacks read (constructs/compute/backend.py: ComputeBackend); mypy holds
    # the types, this holds the synthesized objects: a runner with the three seam facts, metrics, queue list.
    for backend, (module, class_name, _) in COMPUTE_STACKS.items():
        synthesized = synth(compute=backend)
        stack = synthesized.stacks["compute"]
        assert isinstance(stack, getattr(importlib.import_module(module), class_name))
        runner = stack.job_runner
        assert isinstance(runner.fixed_node_count, bool) and isinstance(runner.restarts_lost_hosts, bool)
        config = synthesized.config  # the quote's and the CLI's fewest nodes are the runner's
        assert config.min_nodes == (config.nodes if runner.fixed_node_count else 1)
        assert all(isinstance(error, str) for error in runner.rejected_errors)
        assert stack.accelerator_metrics.backend == backend
        assert (len(stack.job_queue_names) == 3) == (backend == "batch")


@pytest.mark.parametrize("instance_type", ["g5.12xlarge", "trn1.32xlarge"])
def test_batch_job_definitions_take_every_parameter_the_pipeline_sends(synth, instance_type):
    # contracts.run.JOB_PARAMETERS is what the state machine passes to each job; a Batch job definition that lacked
    # one would run with its default (Batch user guide, "Parameter substitution": Ref::name needs a default).
    # Only Trainium has a compile job.
    from contracts.run import JOB_PARAMETERS

    definitions = synth(instance_type=instance_type).template("compute").find_resources("AWS::Batch::JobDefinition")
    jobs = [job for job in JOB_PARAMETERS if job != "compile" or instance_type.startswith("trn")]
    for job, names in ((job, JOB_PARAMETERS[job]) for job in jobs):
        (definition,) = [d for logical_id, d in definitions.items() if f"{job.capitalize()}JobDefinition" in logical_id]
        command = str(definition["Properties"])
        assert set(names) <= set(definition["Properties"]["Parameters"]), job
        assert all(f"Ref::{name}" in command for name in names), job

"""A registered workload's jobs on Batch (docs/workloads.md): the commands of the templates its runs copy.

Its sanity job is the platform's own (the same check on the same kind of hosts); its train and validate jobs are
copies of these templates (BatchJobDefinitions.add_workload_templates) that the run's pipeline registers with the
workload's image and its declaration in WORKLOAD, where the image's launcher reads it (BatchJobRunner.workload_jobs).
"""

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from constructs.compute.batch.job_definitions import JobSpec


def workload_job_specs(platform: Mapping[str, "JobSpec"]) -> dict[str, "JobSpec"]:
    """A declared workload's train and validate jobs: the launcher's workload flags (user_workload.prepare_run,
    user_validate), the run contract's WORKLOAD_JOB_PARAMETERS as placeholders, the platform jobs' timeouts."""
    train, validate = platform["train"], platform["validate"]
    common = ("--run-id", "Ref::run_id", "--dataset", "Ref::dataset", "--hyperparameters", "Ref::hyperparameters")
    defaults = {"run_id": "manual", "dataset": "sample", "hyperparameters": "{}"}
    gate = ("--baseline", "Ref::baseline", "--tolerance", "Ref::tolerance")
    verdicts = validate.flags[validate.flags.index("--verdict-prefix") :][:2]
    return {
        # `nodes` comes with every multi-node submission (BatchJobRunner), so it has its default here too.
        "train": replace(
            train,
            flags=(*common, "--stop-by", "Ref::stop_by"),
            defaults={**defaults, "nodes": train.defaults["nodes"], "stop_by": train.defaults["stop_by"]},
        ),
        "validate": replace(
            validate,
            flags=(*common, *gate, *verdicts),
            defaults={**defaults, **{k: validate.defaults[k] for k in ("baseline", "tolerance")}},
        ),
    }

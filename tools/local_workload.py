"""`make local-run WORKLOAD=<name>`: a declared workload's stages on this CPU machine, through the image's launcher as
the pipeline's jobs run them: the sanity check, training (your command under the platform's torchrun, 2 processes),
validation through the gate, and the approval the verdict decides (docs/workloads.md).

    .venv/bin/python -m tools.local_workload torch-ddp --out local-run [--hyperparameters '{"max_steps": 40}']

The declaration comes from the environment's `workloads` in cdk.json, else from `examples/<name with _>/workload.json`;
its image must be a folder (your commands run in it, with this machine's Python first on PATH). The run's
hyperparameters are checked against the declaration's schema, as the CLI and the pipeline's first state check them.
Writes under --out: data/, checkpoints/, run/, sanity.json, verdict.json, approval.json (only when the model passes),
report.json and one log per stage.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from contracts.run import validate_run
from contracts.workload import Workload, WorkloadError, built_in_workloads, parse_workload, parse_workloads, schemas

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "training_image"))  # the image's package and its local runner, as `make local-run` runs

import local_run  # noqa: E402
from efa_training.runtime.metrics import PROGRESS_METRIC, parse_emf_lines  # noqa: E402
from local_run import free_port, run_stage  # noqa: E402

RUN_ID = "local-run"


class LocalRunError(Exception):
    """One line for the operator."""


def declared(name: str, env: str) -> Workload:
    """The workload `name` of environment `env` in cdk.json, else the example of that name."""
    environments = json.loads((ROOT / "cdk.json").read_text())["context"]["environments"]
    raw = environments.get(env, {}).get("workloads", {})
    try:
        found = {w.name: w for w in parse_workloads(raw, ROOT)}
        if name in found:
            return found[name]
        example = ROOT / "examples" / name.replace("-", "_") / "workload.json"
        if example.is_file():
            return parse_workload(name, json.loads(example.read_text()), ROOT)
    except WorkloadError as error:
        raise LocalRunError(str(error)) from None
    known = sorted({*found, *(p.parent.name.replace("_", "-") for p in (ROOT / "examples").glob("*/workload.json"))})
    raise LocalRunError(f"WORKLOAD={name!r} is not declared in environment {env!r} nor an example; expected one of "
                        f"{', '.join(known)}")  # fmt: skip


def checked_hyperparameters(workload: Workload, given: str, nproc: int) -> dict:
    """The run's hyperparameters, defaults merged, or one line naming what the schema refuses (its layout degrees
    judged on one node of `nproc` workers)."""
    try:
        hyper = json.loads(given)
    except ValueError:
        hyper = None
    run = {"run_id": RUN_ID, "dataset": "datasets/local/", "workload": workload.name, "hyperparameters": hyper}
    problems = validate_run(run, max_nodes=1, workloads=schemas((workload,)), workers_per_node=nproc)
    if problems:
        raise LocalRunError("; ".join(problems))
    return {**{f.key: f.default for f in workload.hyperparameters if not f.required}, **(hyper or {})}


def stage_env(workload: Workload | None, nproc: int, out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_BATCH_", "PET_", "SAGEMAKER_"))}
    env.setdefault("MLFLOW_TRACKING_URI", local_run.tracking_uri(out))  # the run in a local MLflow store
    env.update(ACCELERATOR_KIND="cpu", ACCELERATORS_PER_NODE=str(nproc), MASTER_PORT=str(free_port()), RUN_ID=RUN_ID)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MAX_RESTARTS="0")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `python` in your commands
    if workload is not None:
        env["WORKLOAD"] = workload.variable
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", help="a declared workload's name, or an example's (torch-ddp)")
    parser.add_argument("--out", default="local-run", help="output folder (its owned paths are replaced)")
    parser.add_argument("--env", default="dev", help="the cdk.json environment whose declarations to read")
    parser.add_argument("--hyperparameters", default="{}", help="a JSON object, checked against the schema")
    parser.add_argument("--nproc", type=int, default=2, help="processes (default %(default)s)")
    args = parser.parse_args(argv)
    try:
        built_in = {w.name: w for w in built_in_workloads()}
        if args.workload in built_in:
            return _built_in(built_in[args.workload], args)
        workload = declared(args.workload, args.env)
        if workload.image_directory is None:
            raise LocalRunError(f"{workload.name}: its image is a URI; a local run needs its folder (image.directory)")
        hyper = checked_hyperparameters(workload, args.hyperparameters, args.nproc)
    except LocalRunError as error:
        print(f"local_workload: error: {error}", file=sys.stderr)
        return 2
    report = run_stages(workload, hyper, Path(args.out).resolve(), args.nproc)
    print(json.dumps(report, indent=2), flush=True)
    return 0 if report["sanity"]["passed"] and report["approved"] else 1


def _built_in(workload: Workload, args: argparse.Namespace) -> int:
    """A built-in trainer's stages (training_image/local_run.py: its own data, a baseline from an early checkpoint),
    at the checked hyperparameters' model size and layout (the GPT's strategy, tensor- and pipeline-parallel
    degrees), and their max_steps where given."""
    hyper = checked_hyperparameters(workload, args.hyperparameters, args.nproc)  # a JSON object by now
    given = json.loads(args.hyperparameters)
    steps = ["--steps", str(hyper["max_steps"])] if isinstance(given, dict) and "max_steps" in given else []
    layout = [  # the GPT's (ctr-ps has a strategy too, but no layout degrees)
        f"--{name.replace('_', '-')}={hyper[name]}"
        for name in ("strategy", "tensor_parallel", "pipeline_parallel")
        if "tensor_parallel" in hyper and name in hyper
    ]
    model = ["--model", str(hyper["model"])]
    return local_run.main(["--out", args.out, "--nproc", str(args.nproc), *model, *layout, *steps])


def run_stages(workload: Workload, hyper: dict, out: Path, nproc: int) -> dict:
    """sanity, train, validate (baseline: the run's own value, as on an environment's first run), approve."""
    fresh(out)
    tracking = local_run.prepare_store(stage_env(None, nproc, out)["MLFLOW_TRACKING_URI"])
    sanity = ["sanity", "--sizes", "64K,1M", "--report", str(out / "sanity.json")]
    stage("sanity", sanity, out, stage_env(None, nproc, out), cwd=ROOT)
    folders = ["--data", str(out / "data"), "--checkpoint-dir", str(out / "checkpoints"), "--run-dir", str(out / "run")]
    common = ["--run-id", RUN_ID, "--hyperparameters", json.dumps(hyper), *folders]
    code_folder = ROOT / str(workload.image_directory)
    (out / "data").mkdir()
    train = stage("train", ["train", *common], out, stage_env(workload, nproc, out), cwd=code_folder)
    validate = ["validate", *common, "--baseline", "none", "--verdict", str(out / "verdict.json")]
    stage("validate", validate, out, stage_env(workload, 1, out), cwd=code_folder)
    verdict = json.loads((out / "verdict.json").read_text())
    if verdict["passed"]:  # what the pipeline's RecordApproval writes, here beside the run
        approval = {
            "run_id": RUN_ID,
            "workload": workload.name,
            "model": str(out / "run" / "model"),
            "verdict": verdict,
        }
        (out / "approval.json").write_text(json.dumps(approval, indent=2) + "\n")
    metrics = _metrics(train)
    report = {
        "workload": workload.name,
        "hyperparameters": hyper,
        "sanity": {"passed": json.loads((out / "sanity.json").read_text())["passed"]},
        "train": {
            name: {"first": values[0], "last": values[-1], "count": len(values)} for name, values in metrics.items()
        },
        "validate": verdict,
        "approved": bool(verdict["passed"]),
        "tracking": tracking,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def stage(name: str, args: list[str], out: Path, env: dict, cwd: Path) -> str:
    """One stage through launch.py, as `make local-run` runs the built-in's (local_run.run_stage); its output."""
    return run_stage(name, args, out, env, cwd)[0].stdout


def _metrics(stdout: str) -> dict[str, list[float]]:
    """The metrics the declared regexes read from the training's lines (the EMF records the launcher printed; not the
    platform's own ProgressLines count)."""
    values: dict[str, list[float]] = {}
    for record in parse_emf_lines(stdout.splitlines()):
        for metric in record["_aws"]["CloudWatchMetrics"][0]["Metrics"]:
            if metric["Name"] != PROGRESS_METRIC:
                values.setdefault(metric["Name"], []).append(record[metric["Name"]])
    return values


def fresh(out: Path) -> None:
    for owned in ("data", "checkpoints", "run"):
        shutil.rmtree(out / owned, ignore_errors=True)
    for stale in ("verdict.json", "approval.json", "sanity.json", "report.json", "mlflow.db"):
        (out / stale).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)


if __name__ == "__main__":
    sys.exit(main())

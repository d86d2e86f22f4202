"""`make destroy ENV=...`: remove an environment's stacks in an order that ends clean, and say what stays.

    .venv/bin/python -m tools.destroy dev [--dry-run] [--allow-running] [-- -c compute=eks ...]

- No run may be in flight (destroying the compute stack ends it) unless --allow-running.
- --dry-run prints the checks it would make and the command, with no credentials, no AWS call and nothing run.
- retain_data false (dev): every stack, `cdk destroy --all` (the CLI removes consumers before producers).
- retain_data true (prod): the file system, buckets and image repositories are kept (RETAIN), and the kept file
  system's network interfaces stay in the training subnet, so the Network stack could not be deleted: every stack
  but Network goes, and the command prints what stayed and how to remove it when you mean to.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from tools import preflight
from tools.deploy import CDK, DeployError, _config, _run, _split_context, _step, caller_account


def plan(
    env: str, *, dry_run: bool, run: Callable[..., int], allow_running: bool = False, extra: Sequence[str] = ()
) -> list[list[str]]:
    """`extra`: the `-c FIELD=VALUE` the environment was deployed with (its compute backend, above all), so the same
    stacks are synthesized and destroyed. With dry_run, prints the checks and the command instead: no credentials,
    no AWS call, nothing run (destroying builds nothing, so Docker is never needed)."""
    context_args, _ = _split_context(extra)
    config = _config(env, None, context_args)
    # Deleting a queue terminates its jobs, so on Batch a job submitted by hand holds the destroy back too.
    batch = config.name if config.compute == "batch" else None
    if dry_run:
        print("\n".join(_plan_lines(env, config, allow_running, batch)), flush=True)
    else:
        _check(env, config, allow_running, batch)
    if config.retain_data:
        # The CLI adds every stack downstream of those named (compute, Pipeline, Observability); Network stays.
        kept = [f"{config.stack_prefix}-{unit}" for unit in ("Storage", "Registry", "Alerts")]
        command = [str(CDK), "destroy", "--force", "-c", f"env={env}", *context_args, *kept]
    else:
        command = [str(CDK), "destroy", "--all", "--force", "-c", f"env={env}", *context_args]
    _step(command, dry_run, run, None, "destroy")
    if config.retain_data:
        print(kept_resources(config.stack_prefix, dry_run), flush=True)
    return [command]


def _check(env: str, config, allow_running: bool, batch: str | None) -> None:
    """What a destroy asks AWS before it runs (preflight.run_in_flight_plan says the same in words)."""
    account = caller_account(config.region)  # STS GetCallerIdentity: the credentials' account
    if config.account and config.account != account:
        raise DeployError(f"environment '{env}' is for account {config.account}, but the credentials are for {account}")
    if not allow_running:
        pipeline = f"{config.stack_prefix}-Pipeline"
        preflight.check_no_run_in_flight(config.region, pipeline, ["every stack"], "destroy", batch)


def _plan_lines(env: str, config, allow_running: bool, batch: str | None) -> list[str]:
    """What _check would ask, in its order, and of which account and region: the dry run's plan."""
    account = f"the account must be {config.account}" if config.account else "any account (cdk.json names none)"
    in_flight = "not checked (--allow-running)"
    if not allow_running:
        in_flight = preflight.run_in_flight_plan(f"{config.stack_prefix}-Pipeline", "destroy", batch)
    return [
        f"destroy plan for {env} (dry run: no AWS credentials, no AWS call; destroying builds nothing, so no Docker)",
        f"  account: {config.account or 'that of the credentials at destroy time (cdk.json names none)'}",
        f"  region: {config.region}",
        f"  compute: {config.compute}; retain_data: {str(config.retain_data).lower()}",
        "checks, in the order the destroy makes them (the first that refuses stops it with one line):",
        f"  credentials: would call STS GetCallerIdentity; {account}",
        f"  run in flight: {in_flight}",
    ]


def kept_resources(prefix: str, dry_run: bool = False) -> str:
    return (
        f"destroy: {'would keep' if dry_run else 'kept'} (retain_data): the FSx file system and the data and "
        f"access-log buckets of {prefix}-Storage, the ECR repositories of {prefix}-Registry, the log groups, and "
        f"{prefix}-Network (the file system's "
        "interfaces are in its subnet). When you mean to remove them: `aws fsx delete-file-system --file-system-id "
        "<FileSystemId output>`, empty and delete the buckets (every object version), delete the repositories "
        f"(`aws ecr delete-repository --force`), then `cdk destroy -c env=<env> {prefix}-Network`."
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("env", help="an environment of cdk.json (dev, prod, ...)")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the plan: no credentials, no AWS call, nothing run"
    )
    parser.add_argument("--allow-running", action="store_true", help="destroy even while a run is in flight")
    arguments = sys.argv[1:] if argv is None else list(argv)
    ours, extra = (
        (arguments[: arguments.index("--")], arguments[arguments.index("--") + 1 :])
        if "--" in arguments
        else (arguments, [])
    )
    args = parser.parse_args(ours)
    return preflight.one_line(
        lambda: plan(args.env, dry_run=args.dry_run, run=_run, allow_running=args.allow_running, extra=extra)
    )


if __name__ == "__main__":
    sys.exit(main())

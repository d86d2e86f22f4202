"""`make destroy ENV=...`: remove an environment's stacks in an order that ends clean, and say what stays.

    .venv/bin/python -m tools.destroy dev [--dry-run] [--allow-running] [-- -c compute=eks ...]

- No run may be in flight (destroying the compute stack ends it) unless --allow-running.
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
    stacks are synthesized and destroyed."""
    context_args, _ = _split_context(extra)
    config = _config(env, None, context_args)
    account = caller_account(config.region)  # credentials; nothing is built, so no Docker
    if config.account and config.account != account:
        raise DeployError(f"environment '{env}' is for account {config.account}, but the credentials are for {account}")
    if not allow_running:
        batch = config.name if config.compute == "batch" else None  # deleting a queue terminates its jobs
        preflight.check_no_run_in_flight(
            config.region, f"{config.stack_prefix}-Pipeline", ["every stack"], "destroy", batch
        )
    if config.retain_data:
        # The CLI adds every stack downstream of those named (compute, Pipeline, Observability); Network stays.
        kept = [f"{config.stack_prefix}-{unit}" for unit in ("Storage", "Registry", "Alerts")]
        command = [str(CDK), "destroy", "--force", "-c", f"env={env}", *context_args, *kept]
    else:
        command = [str(CDK), "destroy", "--all", "--force", "-c", f"env={env}", *context_args]
    _step(command, dry_run, run, None)
    if config.retain_data:
        print(kept_resources(config.stack_prefix), flush=True)
    return [command]


def kept_resources(prefix: str) -> str:
    return (
        f"destroy: kept (retain_data): the FSx file system and the data and access-log buckets of {prefix}-Storage, "
        f"the ECR repositories of {prefix}-Registry, the log groups, and {prefix}-Network (the file system's "
        "interfaces are in its subnet). When you mean to remove them: `aws fsx delete-file-system --file-system-id "
        "<FileSystemId output>`, empty and delete the buckets (every object version), delete the repositories "
        f"(`aws ecr delete-repository --force`), then `cdk destroy -c env=<env> {prefix}-Network`."
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("env", help="an environment of cdk.json (dev, prod, ...)")
    parser.add_argument("--dry-run", action="store_true", help="check and print the plan, run nothing")
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

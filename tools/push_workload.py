"""Build a workload's image on the platform's and push it to the environment's workload repository; print its URI.

    make push-workload ENV=dev NAME=torch-ddp DIR=examples/torch_ddp [REGISTER=examples/torch_ddp/workload.json]

The folder's Dockerfile starts `ARG PLATFORM_IMAGE` then `FROM ${PLATFORM_IMAGE}` (contracts/workload.py checks it):
the build argument is the platform image of this tree (stacks/registry_stack.platform_image_tag, built first when it
is not there). The image goes to `efa-training-<env>-workloads` (config/layout.workload_repository_name; the Registry
stack's output `WorkloadRepositoryUri`), tagged `<name>-<hash of the folder>`, immutable: the same folder pushes once.
What it prints is the URI by digest, what a declaration's `"image": {"uri": ...}` names; with REGISTER the declaration
file is registered with that image at once (tools/pipeline_workloads.py). A user's CI can do the same three steps.
"""

import argparse
import base64
import hashlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from config.layout import stack_name
from stacks.registry_stack import DOCKERFILES, TRAINING_IMAGE_DIR, platform_image_tag
from tools.pipeline_session import CliError, Pipeline, call, environment_config, region_of

Run = Callable[[list[str]], str]


def _docker(command: list[str]) -> str:
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def folder_tag(name: str, folder: Path) -> str:
    """`<name>-<16 hex of the folder's files>`: an unchanged folder is the same tag (ECR refuses a second push)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return f"{name}-{digest.hexdigest()[:16]}"


def push(pipeline: Pipeline, name: str, folder: Path, run: Run = _docker) -> str:
    """The pushed image's URI by digest."""
    repository = _outputs(pipeline, "Registry").get("WorkloadRepositoryUri")
    if not repository:
        raise CliError(f"no output WorkloadRepositoryUri on {stack_name(pipeline.env, 'Registry')}; deploy it first")
    accelerator = environment_config(pipeline.env).instance.accelerator
    platform = platform_image_tag(accelerator)
    if not run(["docker", "images", "-q", platform]).strip():  # the platform image of this tree, once
        run(["docker", "build", "-f", str(TRAINING_IMAGE_DIR / DOCKERFILES[accelerator]), "-t", platform,
             str(TRAINING_IMAGE_DIR)])  # fmt: skip
    image = f"{repository}:{folder_tag(name, folder)}"
    run(["docker", "build", "--build-arg", f"PLATFORM_IMAGE={platform}", "-t", image, str(folder)])
    _login(pipeline, repository.split("/")[0], run)
    run(["docker", "push", image])
    # The digest the registry gave the pushed manifest (docker inspect RepoDigests: <repository>@sha256:...).
    digests = json.loads(run(["docker", "inspect", "--format", "{{json .RepoDigests}}", image]) or "[]")
    pushed = [d for d in digests if d.startswith(repository + "@")]
    if not pushed:
        raise CliError(f"{image}: pushed, but docker names no digest for it in {repository}")
    return pushed[0]


def _login(pipeline: Pipeline, registry: str, run: Run) -> None:
    """docker login with an ECR token (ECR API reference, GetAuthorizationToken: base64 of AWS:<password>)."""
    token = call(pipeline._client("ecr").get_authorization_token)["authorizationData"][0]["authorizationToken"]
    password = base64.b64decode(token).decode().split(":", 1)[1]
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as secret:
        secret.write(password)
        secret.flush()
        run(["sh", "-c", f"docker login --username AWS --password-stdin {registry} < {secret.name}"])


def _outputs(pipeline: Pipeline, unit: str) -> dict[str, str]:
    return pipeline._outputs(stack_name(pipeline.env, unit))


def main(argv: list[str] | None = None, *, session=None, out=None, run: Run = _docker) -> int:
    out = out or sys.stdout
    p = argparse.ArgumentParser(prog="push_workload", description=__doc__.split("\n\n")[0])
    p.add_argument("env")
    p.add_argument("name")
    p.add_argument("folder")
    p.add_argument("--register", help="a declaration file to register with the pushed image")
    args = p.parse_args(argv)
    try:
        pipeline = Pipeline(args.env, region_of(args.env, None), session=session)
        uri = push(pipeline, args.name, Path(args.folder), run)
    except (CliError, subprocess.CalledProcessError) as error:
        print(f"error: {getattr(error, 'stderr', None) or error}".rstrip(), file=sys.stderr)
        return 2
    print(uri, file=out)
    if args.register:
        from tools.pipeline_cli import main as cli

        try:
            declaration = json.loads(Path(args.register).read_text())
        except (OSError, ValueError) as error:  # a missing file, not JSON: one line, the image already pushed
            print(
                f"error: {args.register}: not a readable JSON declaration ({error}); {uri} is pushed", file=sys.stderr
            )
            return 2
        if not isinstance(declaration, dict):
            print(f"error: {args.register}: not a declaration; expected a JSON object", file=sys.stderr)
            return 2
        with tempfile.NamedTemporaryFile("w", suffix=".json") as registered:
            json.dump({**declaration, "image": {"uri": uri}}, registered)
            registered.flush()
            return cli(["workload", "register", args.env, registered.name, "--name", args.name], session=session)
    return 0


if __name__ == "__main__":
    sys.exit(main())

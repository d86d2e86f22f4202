"""Each stack deploys alone: every stack it reads from (an imported export, a weak reference, a Docker image another
stack publishes) is among its declared dependencies in the cloud assembly's manifest, so `cdk deploy <stack>`
deploys them first and `--concurrency` never starts a consumer before its producer."""

import json
import re
from pathlib import Path

import pytest

BACKENDS = ("batch", "eks", "sagemaker")
_IMAGE_DIGEST = re.compile(r"container-assets-[^:\"]*:([0-9a-f]{64})")


def _dependencies(manifest: dict, stack: str) -> set[str]:
    """Every artifact the stack depends on, directly or through another."""
    found: set[str] = set()
    todo = [stack]
    while todo:
        for dependency in manifest["artifacts"].get(todo.pop(), {}).get("dependencies", []):
            if dependency not in found:
                found.add(dependency)
                todo.append(dependency)
    return found


def _publishers(outdir: Path) -> dict[str, str]:
    """Docker image digest -> the stack whose asset manifest builds and pushes it."""
    return {
        digest: manifest.name.removesuffix(".assets.json")
        for manifest in outdir.glob("*.assets.json")
        for digest in json.loads(manifest.read_text()).get("dockerImages", {})
    }


def _producers(template: dict, templates: dict[str, dict], publishers: dict[str, str]) -> set[str]:
    text = json.dumps(template)
    weak = set(re.findall(r'"Fn::GetStackOutput": \{"StackName": "([^"]+)"', text))
    exports = {
        output["Export"]["Name"]: stack
        for stack, other in templates.items()
        for output in other.get("Outputs", {}).values()
        if "Export" in output
    }
    strong = {exports[name] for name in re.findall(r'"Fn::ImportValue": "([^"]+)"', text)}
    images = {publishers[digest] for digest in _IMAGE_DIGEST.findall(text) if digest in publishers}
    return weak | strong | images


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_stack_depends_on_what_it_reads(synth, backend):
    synthesized = synth(compute=backend)
    manifest = json.loads((synthesized.outdir / "manifest.json").read_text())
    publishers = _publishers(synthesized.outdir)
    assert publishers, "no stack publishes the training image"
    for stack, template in synthesized.templates.items():
        missing = _producers(template, synthesized.templates, publishers) - _dependencies(manifest, stack) - {stack}
        assert not missing, f"{stack} reads from {sorted(missing)} without depending on them"

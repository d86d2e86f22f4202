"""What each picture shows, as JSON beside its PNG: the check that a committed picture is the code's, without Graphviz.

`make diagram` writes docs/<picture>.model.json next to each docs/<picture>.png: the model it drew (the
architecture's clusters, nodes and edges; the pipeline's boxes, arrows and folded Pass states) and the SHA-256 of
the PNG it rendered from it. tests/test_diagram.py derives the same models from the app as it is now and compares:
a change to the app that changes a picture fails there until `make diagram` draws it again, and a PNG that is not
the one drawn with its model fails too.
"""

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from tools.diagram.architecture import Architecture, architecture, cluster_label
from tools.diagram.states import Picture, condense, pipeline_definition, state_graph
from tools.diagram.synthesized import Assembly


@dataclass(frozen=True)
class Drawings:
    """The two pictures of one environment and backend, as models."""

    architecture: Architecture
    pipeline: Picture
    pipeline_title: str


def drawings(assembly: Assembly, compute: str) -> Drawings:
    """The models `make diagram` draws for an app synthesized with `-c compute=<compute>`."""
    pipeline_stack = next(name for name in assembly.stacks if cluster_label(name) == "Pipeline")
    prefix = pipeline_stack.rsplit("-", 1)[0]
    return Drawings(
        architecture(assembly, f"{prefix} (compute={compute}): its stacks and their main resources"),
        condense(state_graph(pipeline_definition(assembly.templates[pipeline_stack]))),
        f"{pipeline_stack} (compute={compute}): the training pipeline's states and failure paths",
    )


def documents(drawn: Drawings) -> dict[str, dict]:
    """Picture name prefix ("architecture", "pipeline") -> its model as plain JSON data."""
    return {
        "architecture": asdict(drawn.architecture),
        "pipeline": {"title": drawn.pipeline_title, **asdict(drawn.pipeline)},
    }


def model_path(png: Path) -> Path:
    """docs/pipeline-prod-batch.png -> docs/pipeline-prod-batch.model.json"""
    return png.with_name(png.stem + ".model.json")


def png_sha256(png: Path) -> str:
    return hashlib.sha256(png.read_bytes()).hexdigest()


def model_text(document: dict, png: Path) -> str:
    """The model file's text: the model, and the digest of the PNG drawn from it (written after the PNG)."""
    return json.dumps({"png_sha256": png_sha256(png), "model": document}, indent=1, ensure_ascii=False) + "\n"


def read_model(path: Path) -> tuple[str, dict]:
    """A committed model file: (the digest of its PNG, the model as JSON data)."""
    content = json.loads(path.read_text())
    return content["png_sha256"], content["model"]

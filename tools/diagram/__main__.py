"""`make diagram`: draw docs/architecture-<env>-<compute>.png and docs/pipeline-<env>-<compute>.png.

    .venv/bin/python -m tools.diagram --env prod --compute batch eks sagemaker --out docs

Each picture is drawn from the app synthesized in-process with `-c env=<env> -c compute=<compute>`, and its model
(what it shows, and the PNG's digest) is written beside it as <picture>.model.json: tests/test_diagram.py compares
that model with the app's, so a committed picture that the code has moved away from fails a test until this is run
again. Needs Graphviz (`apt-get install -y graphviz`).
"""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from app import build_app
from config import ConfigError
from config.environment import COMPUTE_BACKENDS
from tools.diagram.models import documents, drawings, model_path, model_text
from tools.diagram.render import render_architecture, render_pipeline
from tools.diagram.synthesized import read_assembly

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.diagram", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="prod", help="environment from cdk.json (default: prod)")
    parser.add_argument("--compute", nargs="+", default=list(COMPUTE_BACKENDS), help="backends to draw (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="folder for the PNG files (default: docs)")
    args = parser.parse_args(argv)
    if shutil.which("dot") is None:
        print("error: Graphviz is missing; install it with: apt-get install -y graphviz", file=sys.stderr)
        return 1
    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    args.out.mkdir(parents=True, exist_ok=True)
    for compute in args.compute:
        try:
            for png in draw({**context, "env": args.env, "compute": compute}, args.out, f"{args.env}-{compute}"):
                print(png)
        except ConfigError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    return 0


def draw(context: dict, out: Path, suffix: str) -> list[Path]:
    """Both pictures as PNG files, each with its model beside it (tools/diagram/models.py): what tests/test_diagram.py
    holds to the app, so a picture the code has moved away from fails a test."""
    with tempfile.TemporaryDirectory(prefix="diagram-") as outdir:
        app, stacks = build_app(context=context, outdir=outdir)
        assembly = read_assembly(list(stacks.values()), Path(app.synth().directory))
    drawn = drawings(assembly, context["compute"])
    pictures = [out / f"architecture-{suffix}.png", out / f"pipeline-{suffix}.png"]
    render_architecture(drawn.architecture, pictures[0])
    render_pipeline(drawn.pipeline, drawn.pipeline_title, pictures[1])
    for png, document in zip(pictures, documents(drawn).values(), strict=True):
        model_path(png).write_text(model_text(document, png))
    return pictures


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: `cdk synth` of the dev environment against an empty CDK app, same CLI, Node, Python and jsii.

The floor is jsii/Node start-up, paid once per process; the goal is a ratio of at most 1.5.
Usage: .venv/bin/python benchmarks/synth_ratio.py [--runs 5]
"""

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CDK = ROOT / "node_modules" / ".bin" / "cdk"
# The smallest app the CLI accepts: one empty stack (an app with no stacks is an error).
EMPTY_APP = "import aws_cdk as cdk\napp = cdk.App()\ncdk.Stack(app, 'Empty')\napp.synth()\n"


def _time(cwd: Path, outdir: str, runs: int, validation: bool = True) -> list[float]:
    env = {**os.environ, "PATH": f"{CDK.parent}:{os.environ['PATH']}", "JSII_NODE": str(CDK.parent / "node")}
    if not validation:
        env["CDK_VALIDATION"] = "false"  # CDK's built-in CloudFormation validation off (cdk-nag still runs)
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(
            [str(CDK), "synth", "--quiet", "--output", outdir], cwd=cwd, env=env, check=True, capture_output=True
        )
        samples.append(time.perf_counter() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs of each app (median reported)")
    args = parser.parse_args()
    for validation in (True, False):
        with tempfile.TemporaryDirectory() as empty:
            Path(empty, "app.py").write_text(EMPTY_APP)
            Path(empty, "cdk.json").write_text(f'{{"app": "{ROOT}/.venv/bin/python app.py"}}')
            _time(Path(empty), f"{empty}/out", 1, validation)  # warm the file cache
            baseline = _time(Path(empty), f"{empty}/out", args.runs, validation)
        with tempfile.TemporaryDirectory() as out:
            ours = _time(ROOT, out, args.runs, validation)
        b, o = statistics.median(baseline), statistics.median(ours)
        label = "as shipped" if validation else "CDK's built-in CloudFormation validation off (CDK_VALIDATION=false)"
        print(f"{label}:")
        print(f"  empty app: median {b:.2f} s over {args.runs} runs ({', '.join(f'{s:.2f}' for s in baseline)})")
        print(f"  dev app:   median {o:.2f} s over {args.runs} runs ({', '.join(f'{s:.2f}' for s in ours)})")
        print(f"  ratio: {o / b:.2f} (goal <= 1.5)")


if __name__ == "__main__":
    main()

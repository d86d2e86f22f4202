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
EMPTY_APP = "import aws_cdk as cdk\ncdk.App().synth()\n"


def _time(cwd: Path, outdir: str, runs: int) -> list[float]:
    env = {**os.environ, "PATH": f"{CDK.parent}:{os.environ['PATH']}", "JSII_NODE": str(CDK.parent / "node")}
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([str(CDK), "synth", "--quiet", "--output", outdir], cwd=cwd, env=env, check=True,
                       capture_output=True)
        samples.append(time.perf_counter() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs of each app (median reported)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as empty:
        Path(empty, "app.py").write_text(EMPTY_APP)
        Path(empty, "cdk.json").write_text(f'{{"app": "{ROOT}/.venv/bin/python app.py"}}')
        _time(Path(empty), f"{empty}/out", 1)  # warm the file cache
        baseline = _time(Path(empty), f"{empty}/out", args.runs)
    with tempfile.TemporaryDirectory() as out:
        ours = _time(ROOT, out, args.runs)
    b, o = statistics.median(baseline), statistics.median(ours)
    print(f"empty app: median {b:.2f} s over {args.runs} runs ({', '.join(f'{s:.2f}' for s in baseline)})")
    print(f"dev app:   median {o:.2f} s over {args.runs} runs ({', '.join(f'{s:.2f}' for s in ours)})")
    print(f"ratio: {o / b:.2f} (goal <= 1.5)")


if __name__ == "__main__":
    main()

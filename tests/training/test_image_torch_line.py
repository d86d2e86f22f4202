"""The code both images run, on the PyTorch they run it with.

The suite's own environment has torch 2.13 (requirements-dev.txt); both images run 2.9: the GPU image's base is the
AWS DLC pytorch-training 2.9.0 and the Neuron image's PyTorch NeuronX 2.9 (the last PyTorch/XLA line for training).
.venv-xla (requirements-xla.txt, created by `make test`) has that 2.9, so the training tests that matter run again
there, on real processes: FSDP2 with DCP checkpoints and every kind of damage set aside (torch's own exceptions
differ between lines), the sanity check's collectives and EFA proof, and the launcher's rendezvous.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # real torchrun processes

ROOT = Path(__file__).resolve().parents[2]
XLA_PYTHON = ROOT / ".venv-xla" / "bin" / "python"
FILES = ["test_training_damage.py", "test_training_sanity.py", "test_rendezvous.py"]
# FSDP's damage cases (DDP's code paths are the same on both lines), a healthy sanity check with its EFA proof, and
# a real two-node rendezvous through launch.py.
SELECT = "fsdp or healthy_group or efa_proof_passes or hosts_the_store"


def _pins(requirements: str) -> dict[str, str]:
    lines = (ROOT / requirements).read_text().splitlines()
    return dict(line.split("==") for line in lines if "==" in line and not line.startswith("#"))


def test_both_images_run_the_pytorch_of_the_second_environment():
    dockerfile = (ROOT / "training_image" / "Dockerfile.gpu").read_text()
    (base,) = re.findall(r"^ARG BASE_IMAGE=.*pytorch-training:(\d+\.\d+\.\d+)-gpu", dockerfile, re.MULTILINE)
    assert _pins("requirements-xla.txt")["torch"] == base  # the Neuron image: test_xla_path.py holds it the same


def test_the_training_tests_that_matter_pass_on_the_images_pytorch(tmp_path):
    assert XLA_PYTHON.exists(), f"{XLA_PYTHON} is missing: `make test` creates it from requirements-xla.txt"
    env = {**os.environ, "TRAINING_PYTHON": str(XLA_PYTHON)}
    env.pop("PYTEST_XDIST_WORKER", None)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-k", SELECT]
        + [f"tests/training/{name}" for name in FILES]
        + ["--basetemp", str(tmp_path / "run")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    passed = re.search(r"(\d+) passed", run.stdout)
    assert run.returncode == 0 and passed and int(passed.group(1)) >= 14, run.stdout[-4000:]
    # And they ran on that PyTorch: the sanity check's report names the version its processes imported.
    (report,) = (tmp_path / "run").glob("shared-sanity/**/sanity.json")
    assert json.loads(report.read_text())["torch"].split("+")[0] == _pins("requirements-xla.txt")["torch"]

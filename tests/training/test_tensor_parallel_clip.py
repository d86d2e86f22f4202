"""Gradient clipping under tensor parallelism (workloads/gpt/parallel.py clip_grad_norm) on 2 real gloo processes:
the norm is the whole model's, not one rank's shard of it, and every gradient is scaled by it as one process would
(tp_clip_run.py). The layout tests compare losses only, which a clip by the shard's norm leaves within their
tolerance when the bound is not reached."""

import json
import math

import pytest

from tests.training import training_helpers as th

pytestmark = pytest.mark.slow  # real torchrun processes


def test_tensor_parallel_clipping_uses_the_whole_models_gradient_norm():
    run = th.torchrun("tp_clip_run.py", [], nproc=2)
    assert run.returncode == 0, run.stderr[-3000:]
    (line,) = [json.loads(text) for text in run.stdout.splitlines() if text.startswith('{"norm"')]
    assert math.isclose(line["norm"], line["expected"], rel_tol=1e-5), line
    # The clipped gradients are ~1e-3 / sqrt(parameters) each: a difference this small is float rounding only.
    assert line["difference"] < 1e-9, line

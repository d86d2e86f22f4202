"""The memory refusal's advice, followed literally (workloads/gpt/memory_check.py): the flags it names, appended to
the refused command line, pass the same check and keep the run's global batch. Advice judged at the run's own
accumulation was refused again once --grad-accum-steps was raised as it said (issue 51)."""

import re
from pathlib import Path

import pytest

from efa_training import train_config
from efa_training.runtime.errors import UsageError
from efa_training.workloads.gpt.memory_check import check_memory
from efa_training.workloads.gpt.preflight import check_layout

H100S = {"ACCELERATOR_KIND": "gpu", "ACCELERATOR_MEMORY_GB": "80", "LOCAL_WORLD_SIZE": "8"}  # p5.48xlarge's
ADVISED = re.compile(r"(--[a-z-]+) (\S+)")


def _config(folder: Path, flags: list[str]) -> train_config.TrainConfig:
    """The config train.py builds from this command line."""
    argv = ["--data", str(folder), "--checkpoint-dir", str(folder / "c"), "--max-steps", "1", *flags]
    return train_config.from_args(train_config.build_parser().parse_args(argv))


def _global_batch(cfg: train_config.TrainConfig, world: int) -> int:
    return world // (cfg.tensor_parallel * cfg.pipeline_parallel) * cfg.micro_batch_size * cfg.grad_accum_steps


@pytest.mark.parametrize(
    ("model", "world", "flags"),
    [
        ("30b", 32, ["--strategy", "fsdp", "--micro-batch-size", "4"]),  # tensor parallelism, more micro-steps
        ("70b", 64, ["--strategy", "fsdp", "--micro-batch-size", "2"]),  # pipeline stages too
        ("70b", 64, ["--strategy", "fsdp", "--micro-batch-size", "4"]),  # a smaller micro-batch too
        ("13b", 8, ["--strategy", "ddp", "--micro-batch-size", "8", "--grad-accum-steps", "2"]),  # from DDP
    ],
)
def test_the_refusals_advice_followed_literally_passes_the_check(tmp_path, model, world, flags):
    env = {**H100S, "WORLD_SIZE": str(world)}
    refused = _config(tmp_path, ["--model", model, *flags])
    with pytest.raises(UsageError) as err:
        check_memory(refused, env)
    advice = ADVISED.findall(err.value.allowed.split(" (about")[0])
    assert {name for name, _ in advice} >= {"--tensor-parallel", "--micro-batch-size", "--grad-accum-steps"}, err.value
    followed = _config(tmp_path, ["--model", model, *flags, *(part for pair in advice for part in pair)])
    check_memory(followed, env)  # no refusal: the advice fits at the accumulation it names
    check_layout(followed.tensor_parallel, env, followed.pipeline_parallel, followed.model_config().n_layer)
    assert _global_batch(followed, world) == _global_batch(refused, world)

"""A DeepSpeed ZeRO script that follows the platform's workload contract (docs/workloads.md): nothing in it imports
the platform. It fits a small MLP (task.py) with ZeRO stage 1, 2 or 3 on generated data.

- ranks and rendezvous: the platform's torchrun (declaration `"launch": "torchrun"`); DeepSpeed reads its RANK,
  WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. NCCL on GPUs; without CUDA, DeepSpeed's CPU accelerator
  (DS_ACCELERATOR=cpu, set before deepspeed is imported) and gloo;
- hyperparameters: the JSON file HYPERPARAMETERS_FILE names (lr, max_steps, checkpoint_every, zero_stage);
- resume: engine.load_checkpoint(CHECKPOINT_DIR) from the tag its `latest` file names; each rank reloads its own
  ZeRO shard of the optimizer state;
- checkpoints: engine.save_checkpoint(CHECKPOINT_DIR, tag="step_<n>"); `latest` is written by this script, not by
  DeepSpeed, once every rank has written its shard (a checkpoint is complete or absent, see `save`);
- stop: on SIGTERM, every rank stops at the same step, saves, exit 0 (the next attempt resumes);
- exit 2 for a bad hyperparameter (the pipeline does not retry it), anything else is an attempt failure;
- metrics: prints `step=<n> loss=<value>` every 10 steps (rank 0's mean loss over those steps), which the
  declaration's regex reads.
"""

import json
import os
import signal
import sys
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist
from task import BATCH, batch, build_model

DEFAULTS = {"lr": 0.01, "max_steps": 200, "checkpoint_every": 20, "zero_stage": 2}
LATEST = "latest"  # DeepSpeed's name for the file that names the newest tag (load_checkpoint and zero_to_fp32 read it)


def hyperparameters() -> dict:
    try:
        values = DEFAULTS | json.loads(Path(os.environ["HYPERPARAMETERS_FILE"]).read_text())
    except (ValueError, TypeError) as error:  # not JSON, or JSON but not an object
        bad(f"the hyperparameters are not a JSON object ({error})")
    unknown = sorted(set(values) - set(DEFAULTS))
    if unknown:
        bad(f"unknown hyperparameters {unknown}; expected {sorted(DEFAULTS)}")
    lr, integers = values["lr"], [values[name] for name in ("max_steps", "checkpoint_every", "zero_stage")]
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr <= 1:
        bad(f"lr={lr!r}; expected a number in (0, 1]")
    if any(isinstance(v, bool) or not isinstance(v, int) for v in integers) or min(integers[:2]) < 1:
        bad(f"max_steps and checkpoint_every must be integers >= 1, zero_stage an integer: {values}")
    if values["zero_stage"] not in (1, 2, 3):
        bad(f"zero_stage={values['zero_stage']}; expected 1, 2 or 3")
    return values


def bad(message: str) -> NoReturn:
    print(f"train.py: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def main() -> int:
    hyper = hyperparameters()  # before DeepSpeed is imported: a bad input ends in a second, not after the import
    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ["DS_ACCELERATOR"] = "cpu"  # read when deepspeed is first imported; on GPUs DeepSpeed detects CUDA
    else:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    import deepspeed  # type: ignore[import-untyped]  # no stubs, no py.typed

    if not cuda:
        # DeepSpeed's CPU backend would compile its shared-memory all-reduce (a C++ extension: more than a minute
        # on 2 cores) when the process group starts; gloo does the reductions here. The table of buildable ops is
        # one dict DeepSpeed keeps in its module, "so edits to it persist" (deepspeed/ops/__init__.py, 0.19.8).
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model()
    config = {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": 1,
        # torch's AdamW: DeepSpeed's fused Adam would be compiled at the first run (a CUDA toolkit on GPUs, a C++
        # toolchain on CPU); ZeRO accepts it, and refuses SGD unless zero_allow_untested_optimizer is set.
        "optimizer": {"type": "AdamW", "params": {"lr": hyper["lr"], "torch_adam": True}},
        "zero_optimization": {"stage": hyper["zero_stage"]},
        "steps_per_print": 10**9,  # the script prints its own metric lines
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    checkpoints = Path(os.environ["CHECKPOINT_DIR"])
    step = 0
    if (checkpoints / LATEST).is_file():
        path, client_state = engine.load_checkpoint(str(checkpoints))
        if path is None:
            raise RuntimeError(f"train.py: could not load the checkpoint {checkpoints / LATEST} names")
        step = client_state["step"]
        if rank == 0:
            print(f"resumed from step={step}", flush=True)
    saved, window = step, []  # this window's losses, kept on the device: no sync per step
    stop: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    while step < hyper["max_steps"] and not stopping(stop, engine.device):
        x, y = batch(seed=step * world + rank)  # each rank its own batch; the same batches after a resume
        loss = torch.nn.functional.mse_loss(engine(x.to(engine.device)), y.to(engine.device))
        engine.backward(loss)
        engine.step()
        step += 1
        window.append(loss.detach())
        if step % 10 == 0:
            if rank == 0:
                print(f"step={step} loss={torch.stack(window).mean().item():.6f}", flush=True)
            window = []
        if step % hyper["checkpoint_every"] == 0 or step == hyper["max_steps"]:
            saved = save(engine, checkpoints, step, rank)
    if step != saved:  # stopped between checkpoints
        saved = save(engine, checkpoints, step, rank)
    if stop and rank == 0:
        print(f"stopped at step={step}: saved", flush=True)
    dist.destroy_process_group()
    # End without interpreter finalization, as examples/torch_ddp does: gloo's threads can abort a finished process at
    # exit ("terminate called without an active exception", pytorch/pytorch#179291); the checkpoint is complete.
    sys.stdout.flush()
    os._exit(0)


def stopping(stop: list, device: torch.device) -> bool:
    """Every rank stops at the same step: a SIGTERM seen by any rank stops them all (all-reduce of the flag, on the
    engine's device: NCCL reduces only CUDA tensors)."""
    flag = torch.tensor([1.0 if stop else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def save(engine, checkpoints: Path, step: int, rank: int) -> int:
    """Every rank writes its shard of tag step_<n>; then rank 0 points `latest` at it. DeepSpeed's own save_latest
    has rank 0 write `latest` once its own files are written, before the other ranks' shards are known to be (and
    by truncating the file in place): a job killed then would resume from an incomplete tag. Here `latest` changes
    after a barrier, by rename, so it names a complete tag or the previous one."""
    tag = f"step_{step}"
    engine.save_checkpoint(str(checkpoints), tag=tag, client_state={"step": step}, save_latest=False)
    dist.barrier()
    if rank == 0:
        partial = checkpoints / f"{LATEST}.partial"
        partial.write_text(tag)
        partial.replace(checkpoints / LATEST)
    dist.barrier()
    return step


if __name__ == "__main__":
    sys.exit(main())

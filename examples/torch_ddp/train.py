"""A plain PyTorch DDP script that follows the platform's workload contract (docs/workloads.md): nothing in it
imports the platform. It fits y = 3x - 1 with a one-layer model on generated data.

- ranks and rendezvous: torchrun's variables (RANK, WORLD_SIZE, ...), gloo on CPU, NCCL on GPUs;
- hyperparameters: the JSON file HYPERPARAMETERS_FILE names (lr, max_steps, checkpoint_every);
- resume: from CHECKPOINT_DIR/latest.pt, written atomically by rank 0 (rename after write);
- stop: on SIGTERM, every rank stops at the same step, rank 0 saves, exit 0 (the next attempt resumes);
- exit 2 for a bad hyperparameter (the pipeline does not retry it), anything else is an attempt failure;
- metrics: prints `step=<n> loss=<value>`, which the declaration's regex reads.
"""

import json
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def hyperparameters() -> dict:
    values = {"lr": 0.05, "max_steps": 200, "checkpoint_every": 20}
    values |= json.loads(Path(os.environ["HYPERPARAMETERS_FILE"]).read_text())
    if not 0 < values["lr"] <= 1 or values["max_steps"] < 1 or values["checkpoint_every"] < 1:
        print(f"train.py: bad hyperparameters {values}", file=sys.stderr)
        sys.exit(2)
    return values


def main() -> int:
    hyper = hyperparameters()
    # On GPUs each process drives the GPU of its local rank, and NCCL's tensors live there; on CPU, gloo.
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank()
    torch.manual_seed(1234 + rank)
    model = DistributedDataParallel(torch.nn.Linear(1, 1).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=hyper["lr"])
    latest = Path(os.environ["CHECKPOINT_DIR"]) / "latest.pt"
    step = 0
    if latest.is_file():
        saved = torch.load(latest, map_location=device)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        step = saved["step"]
        print(f"resumed from step={step}", flush=True)
    stop: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    stopped = False
    while step < hyper["max_steps"] and not (stopped := stopping(stop, device)):
        x = torch.rand(64, 1, device=device) * 2 - 1
        loss = torch.nn.functional.mse_loss(model(x), 3 * x - 1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if rank == 0 and step % 10 == 0:
            print(f"step={step} loss={loss.item():.6f}", flush=True)
        if step % hyper["checkpoint_every"] == 0 or step == hyper["max_steps"]:
            save(rank, latest, model, optimizer, step)
    if stopped:  # the all-reduced flag: every rank saves together, not only those the signal reached
        save(rank, latest, model, optimizer, step)
        if rank == 0:
            print(f"stopped at step={step}: saved", flush=True)
    dist.destroy_process_group()
    # End without interpreter finalization: gloo's threads can abort a finished process at exit ("terminate called
    # without an active exception", pytorch/pytorch#179291); the checkpoint is complete before this.
    sys.stdout.flush()
    os._exit(0)


def stopping(stop: list, device: torch.device) -> bool:
    """Every rank stops at the same step: a SIGTERM seen by any rank stops them all (all-reduce of the flag)."""
    flag = torch.tensor([1.0 if stop else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def save(rank: int, latest: Path, model, optimizer, step: int) -> None:
    if rank == 0:
        partial = latest.with_suffix(".partial")
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, partial)
        partial.replace(latest)  # a checkpoint is complete or absent
    dist.barrier()


if __name__ == "__main__":
    sys.exit(main())

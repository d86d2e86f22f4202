"""The PyTorch side of train.py: a residual MLP block (a transformer's feed-forward half) learns a fixed random
teacher on a 2-D device mesh (dp, tp). Tensor parallelism on the inner "tp" dimension (its ranks are consecutive, so
inside a node when tp <= the accelerators per node: NVLink on GPUs), FSDP2 on the outer "dp" dimension (across nodes:
EFA), checkpoints with torch.distributed.checkpoint (DCP), which reshards on load into any other layout."""

import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

WIDTH = 16  # the block's input and output width
BATCH = 32  # samples per step on each dp rank
LATEST = "latest"  # CHECKPOINT_DIR/latest: the name of the newest complete checkpoint folder
PRINT_EVERY = 10


class Block(torch.nn.Module):
    """x + down(relu(up(x))): Megatron's split of a feed-forward block, one all-reduce over tp per forward."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(WIDTH, hidden)  # tp: column-parallel (each rank holds hidden / tp output features)
        self.down = torch.nn.Linear(hidden, WIDTH)  # tp: row-parallel (partial sums, all-reduced over tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def teacher(x: torch.Tensor) -> torch.Tensor:
    """The fixed random function to learn: the same on every rank and in evaluate.py."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(WIDTH, 32, generator=g) / WIDTH**0.5, torch.randn(32, WIDTH, generator=g) / 32**0.5
    return x + torch.tanh(x @ a) @ b


def batch(seed: int, size: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(size, WIDTH, generator=torch.Generator().manual_seed(seed))
    return x, teacher(x)


def train_seed(step: int, dp_rank: int) -> int:
    """Step `step`'s data on dp rank `dp_rank`: the same on every tp rank of a dp group, and again after a resume."""
    return 1_000_003 * step + dp_rank


def train(hyper: dict, hidden: int, stop: list) -> None:
    """Train to hyper["max_steps"] from the newest checkpoint, or until a SIGTERM (`stop` not empty on some rank)."""
    world_size, tp = int(os.environ["WORLD_SIZE"]), hyper["tp"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    # tp is the inner dimension: ranks r..r+tp-1 form a tp group (one node's accelerators when tp <= per node).
    mesh = init_device_mesh(device, (world_size // tp, tp), mesh_dim_names=("dp", "tp"))
    rank, dp_rank = dist.get_rank(), mesh["dp"].get_local_rank()
    if rank == 0:
        print(f"mesh dp={world_size // tp} tp={tp} on {device}", flush=True)

    torch.manual_seed(0)  # the same initial weights on every rank before they are sharded
    model = Block(hidden).to(device)
    parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    optimizer = torch.optim.Adam(model.parameters(), lr=hyper["lr"])

    checkpoints = Path(os.environ["CHECKPOINT_DIR"])
    step = resume(checkpoints, model, optimizer)
    if rank == 0 and step:
        print(f"resumed from step={step}", flush=True)

    stopped = False  # the same on every rank, even where no SIGTERM arrived
    while step < hyper["max_steps"] and not (stopped := stopping(stop, device)):
        x, y = batch(train_seed(step, dp_rank))
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % PRINT_EVERY == 0 or step == hyper["max_steps"]:
            mean = loss.detach().clone()  # every tp rank has its dp group's loss: the mean over dp groups
            dist.all_reduce(mean, group=mesh["dp"].get_group())
            if rank == 0:
                print(f"step={step} loss={mean.item() / mesh['dp'].size():.6f}", flush=True)
        if step % hyper["checkpoint_every"] == 0 or step == hyper["max_steps"]:
            save(checkpoints, model, optimizer, step)
    if stopped:
        save(checkpoints, model, optimizer, step)
        if rank == 0:
            print(f"stopped at step={step}: saved", flush=True)
    dist.destroy_process_group()


def stopping(stop: list, device: str) -> bool:
    """Every rank stops at the same step: a SIGTERM seen by any rank stops them all (all-reduce of the flag)."""
    flag = torch.tensor([1.0 if stop else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def latest(checkpoints: Path) -> Path | None:
    """The newest complete checkpoint, as CHECKPOINT_DIR/latest names it (None before the first)."""
    marker = checkpoints / LATEST
    return checkpoints / marker.read_text().strip() if marker.is_file() else None


def resume(checkpoints: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load the newest complete checkpoint into the sharded model and optimizer; the step it was taken at (0: none).
    DCP reads each rank's own shards, whatever layout wrote them."""
    folder = latest(checkpoints)
    if folder is None:
        return 0
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.load({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder)  # in place
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state)
    return int(folder.name.removeprefix("step_"))


def save(checkpoints: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    """Every rank writes its shards into step_<n>; once all have (the barrier), rank 0 points `latest` at it and drops
    the older folders. A checkpoint is named in `latest` only once complete, so a crash mid-save resumes the one
    before."""
    folder = checkpoints / f"step_{step}"
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder)
    dist.barrier()
    if dist.get_rank() == 0:
        partial = checkpoints / f"{LATEST}.partial"
        partial.write_text(folder.name)
        partial.replace(checkpoints / LATEST)
        for old in checkpoints.glob("step_*"):
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)

"""A user's training script for benchmarks/launcher_overhead.py: DDP on an MLP (gloo on CPU), a metric line every 10
steps, and on rank 0 one last line with its steady-state steps per second (after 20 warm-up steps) and when its
first step ended (a Unix time), so start-up and throughput are measured apart. Follows the workload contract."""

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

WARMUP = 20


def main() -> None:
    steps = json.loads(Path(os.environ["HYPERPARAMETERS_FILE"]).read_text())["max_steps"]
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    first = warm = 0.0
    for step in range(1, steps + 1):
        x = torch.randn(128, 256)
        loss = torch.nn.functional.mse_loss(model(x), x[:, :1])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        first = first or time.time()
        warm = time.perf_counter() if step == WARMUP else warm
        if dist.get_rank() == 0 and step % 10 == 0:
            print(f"step={step} loss={loss.item():.6f}", flush=True)
    if dist.get_rank() == 0:
        rate = (steps - WARMUP) / (time.perf_counter() - warm)
        print(json.dumps({"bench": {"steps_per_s": rate, "first_step_at": first}}), flush=True)
    dist.destroy_process_group()
    os._exit(0)  # as examples/torch_ddp/train.py: gloo's threads can abort a finished process at exit


if __name__ == "__main__":
    main()

"""The reference for the throughput benchmark: the smallest reasonable DDP training loop.

Same model (model.GPT), same shards, same batch shape and optimizer as train.py, but no
gradient clipping, LR schedule, metrics all-reduce, checkpointing or signal handling.
    torchrun --nproc-per-node 2 minimal_ddp_loop.py --data DIR --model mini --steps 150
Prints one JSON line: per-step times (seconds) measured like train.py's StepTimeSeconds.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from efa_training.workloads.gpt.data import HEADER  # noqa: E402
from efa_training.workloads.gpt.model import GPT, model_config  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", required=True, help="prepare_data.py output directory")
    p.add_argument("--model", default="mini", help="model size name (default mini)")
    p.add_argument("--steps", type=int, default=150, help="optimizer steps")
    p.add_argument("--micro-batch-size", type=int, default=8, help="sequences per process per step")
    p.add_argument("--seed", type=int, default=1, help="seed")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = model_config(args.model)
    torch.manual_seed(args.seed)
    model = DDP(GPT(cfg))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    tokens = np.memmap(sorted(Path(args.data).glob("train_*.bin"))[0], dtype=np.uint16, mode="r", offset=HEADER.size)
    n_samples = (len(tokens) - 1) // cfg.seq_len
    order = np.random.default_rng(args.seed).permutation(n_samples)
    times, pos = [], 0
    for _ in range(args.steps):
        t0 = time.perf_counter()
        idx = [order[(pos + rank * args.micro_batch_size + j) % n_samples] for j in range(args.micro_batch_size)]
        pos += world * args.micro_batch_size
        batch = torch.from_numpy(
            np.stack([tokens[i * cfg.seq_len : i * cfg.seq_len + cfg.seq_len + 1].astype(np.int64) for i in idx])
        )
        loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()  # one host sync per step, like any loop that logs its loss
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print(json.dumps({"step_times": times, "tokens_per_step": world * args.micro_batch_size * cfg.seq_len}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

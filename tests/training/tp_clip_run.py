"""One step's gradient clipping of the GPT split over 2 tensor-parallel ranks, against the same model whole (test-only).

Run by torchrun on 2 processes (test_tensor_parallel_clip.py): each rank builds the model as train.py does for
`--strategy fsdp --tensor-parallel 2` (FSDP2 over dp 1, the blocks split over tp 2) and, seeded alike, the same model
whole; both take the same batch, then the parallel model is clipped with parallel.clip_grad_norm (the trainer's) and
the whole one with torch.nn.utils.clip_grad_norm_. Rank 0 prints one JSON line: both norms, and the largest
difference between a clipped gradient of the parallel model (gathered) and the whole model's.
"""

import json
import os
import sys
from pathlib import Path

MAX_NORM = 1e-3  # far below the tiny model's gradient norm, so every gradient is scaled by it


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "training_image"))
    import torch
    import torch.distributed as dist

    from efa_training.runtime.distributed import Runtime
    from efa_training.train_config import TrainConfig
    from efa_training.workloads.gpt import parallel
    from efa_training.workloads.gpt.builders import build_model, seed_everything
    from efa_training.workloads.gpt.model import GPT
    from efa_training.workloads.gpt.sizes import MODEL_SIZES

    dist.init_process_group("gloo")  # torchrun's environment
    rank, world = dist.get_rank(), dist.get_world_size()
    rt = Runtime("cpu", torch.device("cpu"), rank, rank, world)
    cfg = TrainConfig(data="-", checkpoint_dir="-", max_steps=1, model="tiny", strategy="fsdp", tensor_parallel=2)
    mcfg = MODEL_SIZES["tiny"]
    split = build_model(cfg, mcfg, rt, parallel.device_mesh(rt, 2))
    seed_everything(cfg.seed)
    whole = GPT(mcfg)
    tokens = torch.randint(0, mcfg.vocab_size, (4, mcfg.seq_len + 1), generator=torch.Generator().manual_seed(0))
    for model in (split, whole):
        model(tokens[:, :-1], tokens[:, 1:]).backward()
    norm = parallel.clip_grad_norm(list(split.parameters()), MAX_NORM)
    expected = torch.nn.utils.clip_grad_norm_(list(whole.parameters()), MAX_NORM)
    reference = dict(whole.named_parameters())
    difference = 0.0
    for name, p in split.named_parameters():
        grad, alone = p.grad, reference[name].grad
        assert grad is not None and alone is not None  # every parameter takes part in the loss
        whole_grad = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
        difference = max(difference, (whole_grad - alone).abs().max().item())
    if rank == 0:
        print(json.dumps({"norm": norm.item(), "expected": expected.item(), "difference": difference}), flush=True)
    dist.destroy_process_group()
    # End without interpreter finalization: gloo's threads can abort a finished process at exit ("terminate called
    # without an active exception", pytorch/pytorch#179291); the result is printed before this.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

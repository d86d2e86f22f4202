"""What train.py fits and evaluate.py measures, in one place so the two cannot drift: a small MLP, and deterministic
generated data for y = sin(x @ w) + 1 (w fixed). A batch is a function of its seed alone, so a resumed run sees the same
batches it would have seen without the interruption, and the holdout's seed is outside every training seed."""

import torch

FEATURES, HIDDEN, BATCH = 8, 64, 32  # BATCH: per process (DeepSpeed's train_micro_batch_size_per_gpu)
HOLDOUT_SEED, HOLDOUT_SIZE = 2**40, 1024


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1))


def batch(seed: int, size: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.randn(FEATURES, 1, generator=torch.Generator().manual_seed(7)) / 2
    x = torch.rand(size, FEATURES, generator=torch.Generator().manual_seed(seed)) * 2 - 1
    return x, torch.sin(x @ w) + 1

"""A click-through-rate model of the DLRM family (Naumov et al. 2019, facebookresearch/dlrm): a bottom MLP over the 13
dense features, one embedding table per categorical feature, the pairwise dot products of all 27 vectors, and a top
MLP over them and the bottom MLP's output, giving one logit.

The embedding tables are not part of the module: under the parameter-server strategy (server.py) they live, row-sharded,
in the servers' host memory, and a worker hands the rows of its batch to `forward`. `CtrModel` is the dense part, the
same on every worker; `full_tables` in validation holds whole tables for evaluation on one host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from efa_training.workloads.ctr_ps.criteo import N_DENSE, N_SPARSE


@dataclass(frozen=True)
class CtrConfig:
    rows: int  # rows per table: a categorical hash h is row h % rows
    dim: int  # embedding width = the bottom MLP's output width
    bottom: tuple[int, ...]  # hidden widths of the bottom MLP
    top: tuple[int, ...]  # hidden widths of the top MLP

    @property
    def table_rows(self) -> int:
        return self.rows * N_SPARSE

    def table_bytes(self) -> int:
        """Host memory of every table with its row-wise Adagrad state (float32): what the servers hold together."""
        return self.table_rows * (self.dim + 1) * 4


# Sizes, from the tests' up to tables of hundreds of millions of rows (ctr-large: 26 x 10M = 260M rows of 64
# floats, 69 GB with the optimizer state, spread over the servers' host memory).
CTR_SIZES: dict[str, CtrConfig] = {
    "ctr-tiny": CtrConfig(rows=1024, dim=8, bottom=(32,), top=(64,)),
    "ctr-small": CtrConfig(rows=100_000, dim=16, bottom=(64,), top=(128, 64)),
    "ctr-large": CtrConfig(rows=10_000_000, dim=64, bottom=(512, 256), top=(512, 256)),
}


def _mlp(widths: list[int], last_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:], strict=False)):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2 or last_activation:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class CtrModel(nn.Module):
    pair_rows: torch.Tensor  # buffers: the (i < j) pairs of the 27 vectors whose dot products feed the top MLP
    pair_cols: torch.Tensor

    def __init__(self, cfg: CtrConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.bottom = _mlp([N_DENSE, *cfg.bottom, cfg.dim], last_activation=True)
        vectors = N_SPARSE + 1
        pairs = vectors * (vectors - 1) // 2
        self.top = _mlp([pairs + cfg.dim, *cfg.top, 1], last_activation=False)
        rows, cols = torch.triu_indices(vectors, vectors, offset=1)
        self.register_buffer("pair_rows", rows, persistent=False)
        self.register_buffer("pair_cols", cols, persistent=False)

    def forward(self, dense: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        """Logits (B,) of dense features (B, 13) and the batch's embedding rows (B, 26, dim)."""
        x = self.bottom(dense)
        vectors = torch.cat([x.unsqueeze(1), embedded], dim=1)  # (B, 27, dim)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, self.pair_rows, self.pair_cols]
        return self.top(torch.cat([x, dots], dim=1)).squeeze(1)


def table_rows(sparse: torch.Tensor, rows: int) -> torch.Tensor:
    """Global row ids (B, 26) of the categorical hashes: table f's row r is f * rows + r."""
    offsets = torch.arange(N_SPARSE, dtype=torch.int64) * rows
    return sparse.to(torch.int64) % rows + offsets

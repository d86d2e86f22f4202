"""GPT-style decoder-only transformer (pre-norm, GELU MLP, tied embeddings).

Sizes are picked by name so a job definition says `--model 1.3b` instead of six
numbers; `tiny` exists for CPU tests. The layout follows GPT-2/nanoGPT so the
parameter counts are the familiar ones.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# The sizes and their FLOPs live in sizes.py (no torch, so the cost report can read them); re-exported here.
from efa_training.workloads.gpt.sizes import MODEL_SIZES, ModelConfig, count_params, flops_per_token, model_config

__all__ = ["GPT", "MODEL_SIZES", "ModelConfig", "count_params", "flops_per_token", "model_config"]


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        # SDPA picks flash/memory-efficient kernels on GPU and a deterministic math path on CPU.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model),
            nn.GELU(approximate="tanh"),
            nn.Linear(4 * cfg.d_model, cfg.d_model),
            nn.Dropout(cfg.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.tie_weights()
        self.init_weights()

    def tie_weights(self) -> None:
        """The output head shares the token embedding, as in GPT-2. Moving a module to an XLA device copies each
        parameter per module and so unties them (PyTorch/XLA TROUBLESHOOTING.md, "XLA Tensor Quirks": tie weights
        after moving the model to the device; pytorch/xla#7042): builders.py ties again after the move."""
        self.lm_head.weight = self.tok_emb.weight

    def init_weights(self) -> None:
        """Separate from __init__ so FSDP2 can build on the meta device, shard, then initialise."""
        self.apply(self._init_weights)
        # GPT-2: scale residual projections by 1/sqrt(2*n_layer) so activations stay O(1) with depth.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.cfg.n_layer))
        for module in self.modules():
            if isinstance(module, nn.LayerNorm):
                module.reset_parameters()

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        # Loss in fp32 even under bf16 autocast: cross-entropy over the vocab is precision-sensitive.
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))

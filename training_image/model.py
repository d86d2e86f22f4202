"""GPT-style decoder-only transformer (pre-norm, GELU MLP, tied embeddings).

Sizes are picked by name so a job definition says `--model 1.3b` instead of six
numbers; `tiny` exists for CPU tests. The layout follows GPT-2/nanoGPT so the
parameter counts are the familiar ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from errors import UsageError


@dataclass(frozen=True)
class ModelConfig:
    n_layer: int
    n_head: int
    d_model: int
    seq_len: int
    vocab_size: int = 320  # 257 byte-level ids padded to a multiple of 64 for matmul efficiency
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "d_model", "seq_len", "vocab_size"):
            if getattr(self, name) < 1:
                raise UsageError(f"model.{name}", getattr(self, name), "must be positive", ">= 1")
        if self.d_model % self.n_head:
            raise UsageError(
                "model.d_model", self.d_model, f"not divisible by n_head={self.n_head}", "a multiple of n_head"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise UsageError("model.dropout", self.dropout, "out of range", "0 <= dropout < 1")


MODEL_SIZES: dict[str, ModelConfig] = {
    "tiny": ModelConfig(n_layer=2, n_head=4, d_model=64, seq_len=64),
    "mini": ModelConfig(n_layer=4, n_head=4, d_model=128, seq_len=128),
    "125m": ModelConfig(n_layer=12, n_head=12, d_model=768, seq_len=1024),
    "350m": ModelConfig(n_layer=24, n_head=16, d_model=1024, seq_len=1024),
    "760m": ModelConfig(n_layer=24, n_head=16, d_model=1536, seq_len=2048),
    "1.3b": ModelConfig(n_layer=24, n_head=32, d_model=2048, seq_len=2048),
    "2.7b": ModelConfig(n_layer=32, n_head=32, d_model=2560, seq_len=2048),
    "6.7b": ModelConfig(n_layer=32, n_head=32, d_model=4096, seq_len=2048),
    "13b": ModelConfig(n_layer=40, n_head=40, d_model=5120, seq_len=2048),
}


def model_config(name: str, seq_len: int | None = None, vocab_size: int | None = None) -> ModelConfig:
    if name not in MODEL_SIZES:
        raise UsageError("--model", name, "unknown model size", ", ".join(MODEL_SIZES))
    cfg = MODEL_SIZES[name]
    if seq_len:
        cfg = replace(cfg, seq_len=seq_len)
    if vocab_size and vocab_size > cfg.vocab_size:
        cfg = replace(cfg, vocab_size=math.ceil(vocab_size / 64) * 64)
    return cfg


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
        self.lm_head.weight = self.tok_emb.weight  # weight tying, as in GPT-2
        self.init_weights()

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


def count_params(cfg: ModelConfig) -> int:
    """Parameters without instantiating the model (for MFU of multi-billion configs)."""
    d, L, v = cfg.d_model, cfg.n_layer, cfg.vocab_size
    per_block = 12 * d * d + 13 * d  # qkv+proj+mlp weights and biases, two LayerNorms
    return v * d + cfg.seq_len * d + L * per_block + 2 * d


def flops_per_token(cfg: ModelConfig) -> float:
    """Training FLOPs per token: 6N for the matmuls plus attention (PaLM appendix B)."""
    n = count_params(cfg) - cfg.seq_len * cfg.d_model  # position embeddings cost no matmul FLOPs
    return 6.0 * n + 12.0 * cfg.n_layer * cfg.d_model * cfg.seq_len

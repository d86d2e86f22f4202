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
    """Multi-head causal self-attention. The query, key and value projections are three layers, so tensor
    parallelism (parallel.py) splits each by heads; releases up to 0.8.0 had one fused `qkv` layer, whose weights
    `split_fused_qkv` turns into these on load (a saved model, a validation, an initial model)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.head_dim = cfg.d_model // cfg.n_head
        self.q = nn.Linear(cfg.d_model, cfg.d_model)
        self.k = nn.Linear(cfg.d_model, cfg.d_model)
        self.v = nn.Linear(cfg.d_model, cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout
        self.register_load_state_dict_pre_hook(split_fused_qkv)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: all of them, or this rank's share under tensor parallelism (its slice of q, k and v).
        q, k, v = (z.view(b, t, -1, self.head_dim).transpose(1, 2) for z in (self.q(x), self.k(x), self.v(x)))
        # SDPA picks flash/memory-efficient kernels on GPU and a deterministic math path on CPU.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


def split_fused_qkv(module: nn.Module, state_dict: dict, prefix: str, *_: object) -> None:
    """A state dict of a release up to 0.8.0 (one `qkv` layer, rows q then k then v) as this module's three."""
    for kind in ("weight", "bias"):
        fused = state_dict.pop(f"{prefix}qkv.{kind}", None)
        if fused is not None:
            for name, part in zip("qkv", fused.chunk(3, dim=0), strict=True):
                state_dict[f"{prefix}{name}.{kind}"] = part


def fused_qkv(state: dict) -> dict:
    """`state` with each attention's q, k and v entries as one `qkv` entry: the keys a checkpoint of a release up to
    0.8.0 holds, to load it into (DCP loads by key), before `split_fused_qkv` turns it back on load."""
    fused = dict(state)
    for key in [k for k in state if k.endswith("attn.q.weight") or k.endswith("attn.q.bias")]:
        head, kind = key.rsplit("q.", 1)  # "blocks.0.attn.", "weight"
        parts = [fused.pop(f"{head}{name}.{kind}") for name in "qkv"]
        fused[f"{head}qkv.{kind}"] = torch.cat(parts, dim=0)
    return fused


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
        # Each part is None on a pipeline stage that does not run it: the embeddings run on the first, the final
        # norm and the head on the last.
        self.tok_emb: nn.Embedding | None = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb: nn.Embedding | None = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        # A dict keyed by layer number, not a list: a pipeline stage (pipeline.py) deletes the layers it does not run
        # and keeps the others' names ("blocks.7.attn.q.weight"), the names every checkpoint holds (torchtitan alike).
        self.blocks = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layer)})
        self.ln_f: nn.LayerNorm | None = nn.LayerNorm(cfg.d_model)
        self.lm_head: nn.Linear | None = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.tie_weights()
        self.init_weights()

    def tie_weights(self) -> None:
        """The output head shares the token embedding, as in GPT-2. Moving a module to an XLA device copies each
        parameter per module and so unties them (PyTorch/XLA TROUBLESHOOTING.md, "XLA Tensor Quirks": tie weights
        after moving the model to the device; pytorch/xla#7042): builders.py ties again after the move."""
        assert self.lm_head is not None and self.tok_emb is not None  # the whole model
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
        """Token ids to logits (or the loss, given targets). A pipeline stage without the embeddings takes the
        previous stage's activations as `idx`; one without the head returns its activations."""
        x = idx
        if self.tok_emb is not None and self.pos_emb is not None:
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks.values():
            x = block(x)
        if self.lm_head is None or self.ln_f is None:
            return x
        logits = self.lm_head(self.ln_f(x))
        return logits if targets is None else loss(logits, targets)


def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The mean next-token cross-entropy, in fp32 even under bf16 autocast: over the vocab it is precision-sensitive."""
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))

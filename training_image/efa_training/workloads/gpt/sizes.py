"""The model sizes and what they cost to train, without torch: the training image sizes its models from here, and
the cost report (tools/cost_report.py) prices a billion tokens of each from the same FLOPs per token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from efa_training.runtime.errors import UsageError


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
    # The sizes tensor parallelism is for (parallel.py): heads of 128 features, in multiples of 8 (a node's GPUs).
    "30b": ModelConfig(n_layer=48, n_head=56, d_model=7168, seq_len=2048),
    "70b": ModelConfig(n_layer=88, n_head=64, d_model=8192, seq_len=2048),
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


def count_params(cfg: ModelConfig) -> int:
    """Parameters without instantiating the model (for MFU of multi-billion configs)."""
    d, L, v = cfg.d_model, cfg.n_layer, cfg.vocab_size
    per_block = 12 * d * d + 13 * d  # qkv+proj+mlp weights and biases, two LayerNorms
    return v * d + cfg.seq_len * d + L * per_block + 2 * d


def flops_per_token(cfg: ModelConfig) -> float:
    """Training FLOPs per token: 6N for the matmuls plus attention (PaLM appendix B)."""
    n = count_params(cfg) - cfg.seq_len * cfg.d_model  # position embeddings cost no matmul FLOPs
    return 6.0 * n + 12.0 * cfg.n_layer * cfg.d_model * cfg.seq_len


# ---- memory: what one accelerator holds at its peak, estimated, so a run that cannot fit is refused at its start
# Per parameter, the training state: FSDP2 keeps fp32 weights, fp32 gradients and AdamW's two fp32 moments sharded
# (16 bytes, over every rank); DDP keeps them whole, with its gradient buckets (a copy of the gradients: 20 bytes).
STATE_BYTES = {"fsdp": 16, "ddp": 20}
RESERVED_GB = 4.0  # the CUDA context, NCCL's buffers and the allocator's fragmentation: a margin, not a measure


def memory_gb(
    cfg: ModelConfig,
    *,
    micro_batch: int,
    world: int,
    tensor_parallel: int = 1,
    strategy: str,
    pipeline_parallel: int = 1,
    microbatches: int = 1,
) -> float:
    """Estimated peak memory of one accelerator, GB: the training state (STATE_BYTES; with tensor parallelism the
    blocks' split over tp, the embeddings' and norms' not), FSDP2's gathered bf16 weights (a block, the one it
    prefetches and one block's gradients, and the root's embeddings), the activations that backward keeps, the fp32
    logits, and RESERVED_GB. Activations, bf16, no sequence parallelism: s*b*h*(10 + 24/t) bytes per layer
    (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", section 4: eq. 2
    without its 5*a*s/(h*t) term for the stored attention scores and their dropout mask, which the model's
    scaled_dot_product_attention does not keep on GPUs: its flash and memory-efficient kernels recompute them).
    With pipeline parallelism (p stages) a stage holds L/p layers' state, the embeddings counted whole (the first
    and the last stage hold them), and the activations of min(p, m) microbatches in flight (1F1B keeps p on the
    first stage, GPipe all m: Narayanan et al. 2021, section 2.2), each of the step's sequences / m
    (pipeline_microbatches), so at m >= p the activations of L layers of p microbatches: pipelining divides the
    state, and the activations only as far as its microbatches are smaller than the micro-batch; and the stage's
    bf16 weights and fp32 gradients whole, for between microbatches the schedule keeps FSDP2 from resharding and
    reducing (torch.distributed.pipelining's stage.py: reshard_after_backward and requires_gradient_sync off until
    the last), with each microbatch's received activations and their gradients. Accumulating micro-steps without a
    pipeline holds the fp32 gradients whole too (gradient sync off until the last micro-step: builders.py)."""
    d, layers, s, t, p = cfg.d_model, cfg.n_layer, cfg.seq_len, tensor_parallel, pipeline_parallel
    block = 12 * d * d + 13 * d
    other = count_params(cfg) - layers * block
    m = pipeline_microbatches(p, microbatches, micro_batch) if p > 1 else microbatches
    chunk = micro_batch * microbatches / m if p > 1 else micro_batch  # sequences in one forward
    if strategy == "fsdp":
        replicas, whole = world // (t * p), layers / p * block / t + other  # `whole`: this rank's part, unsharded
        state = STATE_BYTES["fsdp"] * whole / replicas
        gathered = 2 * (3 * block / t + other)
        if p > 1 and m > 1:
            gathered = 6 * whole + 2 * m * chunk * s * d * 2
        elif m > 1:
            gathered += 4 * whole
    else:
        state, gathered = STATE_BYTES["ddp"] * count_params(cfg), 0.0
    activations = min(p, m) * layers / p * s * chunk * d * (10 + 24 / t)
    logits = 3 * chunk * s * cfg.vocab_size * 4  # fp32: the logits, their softmax and its gradient
    return (state + gathered + activations + logits) / 1e9 + RESERVED_GB


def pipeline_microbatches(stages: int, micro_steps: int, micro_batch: int) -> int:
    """How many microbatches a pipeline of `stages` cuts one optimizer step into: the step's micro-steps where they
    are at least the stages (1F1B needs as many), else the fewest equal parts of the step's sequences that are (so a
    step of 1 micro-step of 8 sequences on 4 stages runs 4 microbatches of 2), else one per sequence (fewer than the
    stages: GPipe, with its bubble). The global batch never changes: the microbatches are the step's sequences."""
    sequences = micro_steps * micro_batch
    if micro_steps >= stages:
        return micro_steps
    return next((m for m in range(stages, sequences + 1) if sequences % m == 0), sequences)

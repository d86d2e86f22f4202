r"""Train a GPT-style decoder with DDP or FSDP2 on CUDA/NCCL, CPU/gloo or Trainium/XLA.

Launch (elastic, restarts on failure, resumes from the newest good checkpoint):
    torchrun --nnodes 1:4 --nproc-per-node 8 --max-restarts 3 \
        --rdzv-backend c10d --rdzv-endpoint $MAIN_ADDR:29500 --rdzv-id $RUN_ID \
        train.py --data /fsx/data/run1 --checkpoint-dir /fsx/ckpt/run1 \
                 --model 1.3b --strategy fsdp --max-steps 20000 --checkpoint-every 500
CPU, two processes (what the tests do):
    torchrun --nproc-per-node 2 train.py --data d --checkpoint-dir c --model tiny --max-steps 50
In the container, `launch.py train ...` builds the torchrun line from Batch/EKS variables.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from checkpoint import (CheckpointManager, TrainerState, check_reusable, lock_folder_waiting, lock_holder, log,
                        probe_writable)
from data import BatchSpec, SequenceBatches, TokenStream, list_shards, max_token_id, open_shard
from distributed import DEVICES, Runtime, destroy_distributed, init_distributed, resolve_device
from errors import (EXIT_DIVERGED, EXIT_FOLDER_LOCKED, RunRefused, UsageError, exit_refused,
                    exit_with_usage_error)
from metrics import MetricsLogger, peak_tflops
from model import GPT, MODEL_SIZES, ModelConfig, flops_per_token, model_config
from run_paths import add_layout_flags, checkpoint_dir, data_dir, expected_nodes_error

STRATEGIES = ("ddp", "fsdp")
EXIT_SIGTERM = 143  # 128 + SIGTERM: "stopped cleanly on request" (SIGINT too), distinguishable from success
FIRST_AUTO_SAVE = 20  # --checkpoint-every 0: the first save, where the save time is measured
DIVERGED_MARKER = "diverged.json"  # in the checkpoint folder: why the run stopped, so restarts do not repeat it


@dataclass
class TrainConfig:
    data: str
    checkpoint_dir: str
    max_steps: int
    checkpoint_every: int = 0  # 0: Young/Daly interval from the measured save and step times and --mtbf-hours
    mtbf_hours: float = 24.0
    keep_last: int = 3
    seed: int = 1337
    strategy: str = "ddp"
    model: str = "tiny"
    seq_len: int = 0  # 0: the model size's default context
    micro_batch_size: int = 8
    grad_accum_steps: int = 1
    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    loss_spike_factor: float = 10.0  # stop when the loss exceeds this many times its lowest value; 0: never
    device: str = "auto"
    compile: bool = False
    run_id: str = field(default_factory=lambda: os.environ.get("RUN_ID", "local"))
    log_every: int = 1

    def __post_init__(self) -> None:
        positive = ("max_steps", "keep_last", "micro_batch_size", "grad_accum_steps", "log_every")
        for name in positive:
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')}", getattr(self, name), "must be at least 1", ">= 1")
        if self.checkpoint_every < 0:
            raise UsageError("--checkpoint-every", self.checkpoint_every, "negative", "0 (Young/Daly) or >= 1")
        if self.strategy not in STRATEGIES:
            raise UsageError("--strategy", self.strategy, "unknown strategy", "|".join(STRATEGIES))
        if self.model not in MODEL_SIZES:
            raise UsageError("--model", self.model, "unknown model size", ", ".join(MODEL_SIZES))
        if self.device not in DEVICES:
            raise UsageError("--device", self.device, "unknown device", ", ".join(DEVICES))
        context = MODEL_SIZES[self.model].seq_len
        if not 0 <= self.seq_len <= context:
            # The learned position table is the model size's context; longer steps also outlast the stop grace.
            raise UsageError("--seq-len", self.seq_len, f"outside the {self.model} model's context of {context} "
                             "positions", f"0 (= {context}) to {context}")
        # Every float: finite (argparse accepts nan and inf) and in range.
        floats = {"lr": (0.0, 1.0, False), "min_lr_ratio": (0.0, 1.0, True), "weight_decay": (0.0, 10.0, True),
                  "grad_clip": (0.0, 1e6, True), "loss_spike_factor": (0.0, 1e6, True),
                  "mtbf_hours": (0.0, 1e6, False)}
        for name, (low, high, low_ok) in floats.items():
            value = getattr(self, name)
            if not (math.isfinite(value) and (low <= value if low_ok else low < value) and value <= high):
                raise UsageError(f"--{name.replace('_', '-')}", value, "not finite or out of range",
                                 f"{'' if low_ok else 'more than '}{low} to {high}")
        if 0 < self.loss_spike_factor <= 1:
            raise UsageError("--loss-spike-factor", self.loss_spike_factor, "would stop on any noise", "0 (off) or > 1")
        if self.warmup_steps < 0:
            raise UsageError("--warmup-steps", self.warmup_steps, "negative", ">= 0")
        ckpt = Path(self.checkpoint_dir)
        if ckpt.exists() and not ckpt.is_dir():
            raise UsageError("--checkpoint-dir", self.checkpoint_dir, "is a file", "a directory (created if missing)")

    def model_config(self) -> ModelConfig:
        return model_config(self.model, seq_len=self.seq_len or None)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = TrainConfig.__dataclass_fields__
    p.add_argument("--data", default=os.environ.get("DATA_DIR"),
                   help="directory of train_*.bin/val_*.bin shards from prepare_data.py (default: env DATA_DIR, "
                        "else --datasets-root/--dataset)")
    p.add_argument("--checkpoint-dir", default=os.environ.get("CHECKPOINT_DIR"),
                   help="where checkpoints go; the newest loadable one here is resumed automatically "
                        "(default: env CHECKPOINT_DIR, else --checkpoints-root/--run-id)")
    add_layout_flags(p)
    p.add_argument("--expected-nodes", type=int, default=None,
                   help="refuse to start unless torchrun's node count (GROUP_WORLD_SIZE) equals this")
    p.add_argument("--max-steps", type=int, required=True, help="optimizer steps to train for (>= 1)")
    p.add_argument("--checkpoint-every", type=int, default=d["checkpoint_every"].default,
                   help="save every K steps, plus at the last step and on SIGTERM; 0 (default): the Young/Daly "
                        "interval sqrt(2 * save time * MTBF), measured at a first save after "
                        f"{FIRST_AUTO_SAVE} steps")
    p.add_argument("--mtbf-hours", type=float, default=d["mtbf_hours"].default,
                   help="mean time between failures of the whole job, for --checkpoint-every 0 "
                        "(default %(default)s; lower it for Spot or many nodes)")
    p.add_argument("--keep-last", type=int, default=d["keep_last"].default,
                   help="number of newest checkpoints to keep (default %(default)s)")
    p.add_argument("--seed", type=int, default=d["seed"].default, help="seed for init, data order and RNG (default %(default)s)")
    p.add_argument("--strategy", default="ddp", help="ddp (replicated, default) or fsdp (FSDP2 fully_shard, DCP checkpoints)")
    p.add_argument("--model", default=d["model"].default, help=f"model size: {', '.join(MODEL_SIZES)} (default %(default)s)")
    p.add_argument("--seq-len", type=int, default=0, help="context length; 0 uses the model size's default")
    p.add_argument("--micro-batch-size", "--batch-size", dest="micro_batch_size", type=int, default=d["micro_batch_size"].default,
                   help="sequences per process per micro-step (default %(default)s)")
    p.add_argument("--grad-accum-steps", type=int, default=1,
                   help="micro-steps per optimizer step; gradients are synchronised on the last only (default 1)")
    p.add_argument("--lr", type=float, default=d["lr"].default, help="peak learning rate (default %(default)s)")
    p.add_argument("--min-lr-ratio", type=float, default=d["min_lr_ratio"].default,
                   help="cosine decays to lr*ratio at --max-steps (default %(default)s)")
    p.add_argument("--warmup-steps", type=int, default=d["warmup_steps"].default,
                   help="linear warm-up steps before the cosine decay (default %(default)s)")
    p.add_argument("--weight-decay", type=float, default=d["weight_decay"].default,
                   help="AdamW weight decay on matrices (default %(default)s)")
    p.add_argument("--grad-clip", type=float, default=d["grad_clip"].default,
                   help="clip the global gradient norm to this; 0 disables (default %(default)s)")
    p.add_argument("--loss-spike-factor", type=float, default=d["loss_spike_factor"].default,
                   help="stop as diverged (exit 4) when the loss exceeds this many times its lowest value in this "
                        "run; a non-finite loss or gradient norm always stops it; 0 disables the spike test "
                        "(default %(default)s)")
    p.add_argument("--device", default="auto",
                   help="auto (from ACCELERATOR_KIND, else cuda if present, else cpu), cuda, cpu or xla")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (off by default)")
    p.add_argument("--run-id", default=os.environ.get("RUN_ID", "local"),
                   help="RunId dimension of the metrics (default: env RUN_ID, else 'local')")
    p.add_argument("--log-every", type=int, default=1, help="emit a metrics line every N steps (default 1)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def check_data(data_dir: Path, mcfg: ModelConfig) -> None:
    """Fail before any process group exists: a wrong --data is the commonest mistake.

    Token ids beyond the vocabulary would end in an IndexError (a device-side assert on GPU) mid-run."""
    tokens = 0
    for shard in list_shards(data_dir, "train"):
        tokens += open_shard(shard).size
        largest = max_token_id(shard)
        if largest is not None and largest >= mcfg.vocab_size:
            raise UsageError("shard", str(shard), f"holds token id {largest}, beyond the model's vocabulary of "
                             f"{mcfg.vocab_size} ids", "shards tokenized for this model's vocabulary")
    if tokens < mcfg.seq_len + 1:
        raise UsageError("--seq-len", mcfg.seq_len, f"the train split of {data_dir} has only {tokens} tokens",
                         f"at most {max(tokens - 1, 0)} for this data, or more data")


def diverged_config(cfg: TrainConfig) -> dict:
    """The settings that decide whether a run diverges again (not its name or logging)."""
    return {k: v for k, v in asdict(cfg).items() if k not in ("run_id", "log_every")}


def check_not_diverged(cfg: TrainConfig) -> None:
    """Refuse to repeat a run that diverged with the same settings: it would diverge again (training is
    deterministic), and torchrun's restarts and the pipeline's retries would each pay for it."""
    marker = Path(cfg.checkpoint_dir) / DIVERGED_MARKER
    try:
        record = json.loads(marker.read_text())
    except (OSError, ValueError):
        return
    if isinstance(record, dict) and record.get("config") == diverged_config(cfg):
        raise RunRefused(EXIT_DIVERGED, f"this run diverged before with the same settings ({record.get('reason')}); "
                                        f"change them (e.g. --lr, --seed, --data) or delete {marker} to retry")


def lr_lambda(cfg: TrainConfig):
    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        span = max(1, cfg.max_steps - cfg.warmup_steps)
        progress = min(1.0, (step - cfg.warmup_steps) / span)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_model(cfg: TrainConfig, mcfg: ModelConfig, rt: Runtime) -> torch.nn.Module:
    seed_everything(cfg.seed)  # identical initial weights on every rank
    if cfg.strategy == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        # Build on the meta device and initialise after sharding: a 13B model never exists in full
        # on one process (it would need 52 GB of host memory per rank in fp32).
        with torch.device("meta"):
            model = GPT(mcfg)
        # bf16 compute with fp32 gradient reduction on accelerators; fp32 throughout on CPU.
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if rt.device_type == "cuda" else MixedPrecisionPolicy()
        for block in model.blocks:
            if cfg.compile:
                block.compile()
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)  # root holds embeddings/head (tied weights stay together)
        model.to_empty(device=rt.device)
        # On CUDA, DTensor's RNG tracker takes rank 0's state and offsets it per shard. On CPU it
        # has no tracker and each rank draws its shard from its own generator: seeding by rank
        # keeps the shards different (the same seed everywhere would copy one shard into all).
        seed_everything(cfg.seed + rt.rank)
        model.init_weights()
        return model
    model = GPT(mcfg).to(rt.device)
    if cfg.compile:
        model = torch.compile(model)
    if rt.device_type == "xla":
        return model  # Neuron: gradients are all-reduced with xm.reduce_gradients, no DDP wrapper
    return DDP(model, device_ids=[rt.local_rank] if rt.device_type == "cuda" else None)


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, rt: Runtime) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    # Decay matrices only; biases and LayerNorm gains are not regularised (GPT-2 practice).
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8,
                             fused=rt.device_type == "cuda" or None)


def grad_sync_context(model: torch.nn.Module, strategy: str, last_micro_step: bool):
    """All-reduce gradients on the last micro-step only; earlier ones accumulate locally."""
    if strategy == "fsdp":
        model.set_requires_gradient_sync(last_micro_step)
        return contextlib.nullcontext()
    if isinstance(model, DDP) and not last_micro_step:
        return model.no_sync()
    return contextlib.nullcontext()


def replica_checksums(model: torch.nn.Module, strategy: str, rt: Runtime) -> list[float] | None:
    """Every rank's checksum of its parameters (gathered; rank 0 reports them in the summary).

    With replicated parameters (DDP, XLA) they must be equal: a difference means gradients were
    not all-reduced (or were reduced differently) and the replicas have drifted apart. FSDP ranks
    hold different shards, so there is nothing to compare (None).
    """
    if strategy == "fsdp":
        return None
    sums = torch.zeros(rt.world_size, dtype=torch.float64, device=rt.device)
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            values = p.detach().double()
            sums[rt.rank] += (i + 1) * values.sum() + values.square().sum()  # weighted by tensor: swaps show
    dist.all_reduce(sums)  # each rank fills its own slot: a gather built from the per-step collective
    return sums.tolist()


class StopFlag:
    """SIGTERM (Spot/Batch termination, kubectl delete, torchrun shutdown) or SIGINT (Ctrl-C) asks for a final
    checkpoint at the end of the current step."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame) -> None:
        self.requested = True


def train(cfg: TrainConfig) -> int:
    rt = init_distributed(cfg.device)
    if rt.device_type == "xla" and cfg.strategy == "fsdp":
        raise UsageError("--strategy", "fsdp", "FSDP2 is not supported on the xla device", "ddp")
    # CPU kernels used here are deterministic already (the resume test checks it bit for bit);
    # torch.use_deterministic_algorithms is not called because it imports inductor (+1 s per process).
    stop = StopFlag()
    mcfg = cfg.model_config()
    model = build_model(cfg, mcfg, rt)
    optimizer = build_optimizer(model, cfg, rt)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    seed_everything(cfg.seed + rt.rank)  # per-rank streams (dropout); replaced by the checkpoint's on resume
    lock = take_folder(Path(cfg.checkpoint_dir), rt)  # noqa: F841  held until the process ends
    ckpt = CheckpointManager(Path(cfg.checkpoint_dir), "dcp" if cfg.strategy == "fsdp" else "full",
                             cfg.keep_last, rt.rank, rt.world_size)
    resumed = ckpt.load_latest(model, optimizer, scheduler, rt.device)
    state = resumed[0] if resumed else TrainerState()
    if rt.is_main:
        log(f"train: {'resumed from ' + str(resumed[1]) if resumed else 'starting fresh'} at step {state.step}; "
            f"world={rt.world_size} device={rt.device_type} strategy={cfg.strategy} model={cfg.model} "
            f"restart={os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}")

    stream = TokenStream(Path(cfg.data), "train")
    batches = SequenceBatches(stream, BatchSpec(mcfg.seq_len, cfg.micro_batch_size, rt.rank, rt.world_size,
                                                cfg.seed), samples_consumed=state.samples_consumed)
    loader = batches
    if rt.device_type == "xla":
        import torch_xla.distributed.parallel_loader as pl
        # Neuron docs: MpDeviceLoader overlaps host-to-device copies and inserts mark_step per batch.
        loader = pl.MpDeviceLoader(batches, rt.device)
    batch_iter = iter(loader)
    metrics = MetricsLogger(cfg.run_id, enabled=rt.is_main)
    tokens_per_step = rt.world_size * cfg.micro_batch_size * cfg.grad_accum_steps * mcfg.seq_len
    peak = peak_tflops(torch.cuda.get_device_name(rt.device)) if rt.device_type == "cuda" else None
    fpt = flops_per_token(mcfg)
    config_record = {"train": asdict(cfg), "model": asdict(mcfg)}
    start_step, t_start, throughput, loss_val = state.step, time.perf_counter(), [], float("nan")
    last_saved = state.step if resumed else -1
    stopped_by_sigterm = False  # the collective decision: any rank signalled
    checksums = None
    checkpoint_seconds, checkpoints_saved = 0.0, 0  # the training stall caused by saving
    lowest_loss = math.inf
    every = cfg.checkpoint_every or FIRST_AUTO_SAVE  # auto: replaced after the first save
    step_times: list[float] = []

    model.train()
    while state.step < cfg.max_steps:
        t0 = time.perf_counter()
        loss_sum = torch.zeros((), device=rt.device)
        for micro in range(cfg.grad_accum_steps):
            x, y = next(batch_iter)
            x, y = x.to(rt.device, non_blocking=True), y.to(rt.device, non_blocking=True)
            last = micro == cfg.grad_accum_steps - 1
            with grad_sync_context(model, cfg.strategy, last):
                with rt.autocast():
                    loss = model(x, y) / cfg.grad_accum_steps
                loss.backward()
            loss_sum += loss.detach()
        if rt.xm is not None:
            rt.xm.reduce_gradients(optimizer)  # the one gradient all-reduce, after the last micro-step
        # The global norm (all-reduced gradients, or FSDP's sharded norm): the same on every rank. With
        # --grad-clip 0 an infinite bound measures without clipping.
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or math.inf)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        rt.mark_step()  # Neuron docs: one graph per optimizer step, cut right after optimizer.step()
        state.step += 1
        state.samples_consumed += rt.world_size * cfg.micro_batch_size * cfg.grad_accum_steps
        state.tokens_seen += tokens_per_step
        # One tiny all-reduce per step carries the mean loss for the metrics and "did any rank get
        # SIGTERM", so every rank stops at the same step. .tolist() is the step's one host sync.
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP: a DTensor
        stats = torch.stack([loss_sum.float(), torch.tensor(float(stop.requested), device=rt.device),
                             grad_norm.float().to(rt.device) / rt.world_size])
        dist.all_reduce(stats)
        loss_val, stop_votes, norm_val = stats.tolist()
        loss_val /= rt.world_size
        step_time = time.perf_counter() - t0
        step_times.append(step_time)
        tps = tokens_per_step / step_time
        if state.step > start_step + 1:
            throughput.append(tps)  # the first step after (re)start includes warm-up and compilation
        if state.step % cfg.log_every == 0 or state.step == cfg.max_steps:
            mfu = 100.0 * fpt * tps / (peak * 1e12 * rt.world_size) if peak else None
            metrics.step(state.step, loss_val, tps, step_time, mfu, LearningRate=scheduler.get_last_lr()[0])
        # Every rank holds the same loss and norm, so all stop together; before any save, so weights updated
        # from a non-finite gradient never reach a checkpoint and --keep-last never rotates away the good ones.
        reason = divergence(loss_val, norm_val, lowest_loss, cfg.loss_spike_factor)
        if reason:
            raise_diverged(cfg, state.step, reason, last_saved, rt)
        lowest_loss = min(lowest_loss, loss_val)
        stopping = stop_votes > 0
        if state.step == cfg.max_steps or stopping:
            # Before the final save, so the save's barrier stays the last collective before teardown
            # (a collective right before destroy_process_group made gloo abort at exit, 3 runs in 8).
            checksums = replica_checksums(model, cfg.strategy, rt)
        if state.step % every == 0 or state.step == cfg.max_steps or stopping:
            t_save = time.perf_counter()
            path = ckpt.save(model, optimizer, scheduler, state, config_record, rt.mark_step)
            checkpoint_seconds += time.perf_counter() - t_save
            # Not after the final save: its barrier stays the last collective before teardown (see above).
            if not cfg.checkpoint_every and checkpoints_saved == 0 and not stopping and state.step < cfg.max_steps:
                every = young_daly_interval(time.perf_counter() - t_save, step_times, cfg.mtbf_hours, rt)
            checkpoints_saved += 1
            last_saved = state.step
            if rt.is_main:
                log(f"checkpoint: saved {path}{' (SIGTERM)' if stopping else ''}")
        if stopping:
            stopped_by_sigterm = True
            break

    if rt.is_main and checksums and len(set(checksums)) > 1:
        log(f"train: WARNING the ranks' parameters differ (checksums {checksums}): gradients were not "
            "all-reduced the same way on every rank")
    metrics.summary({
        "run_id": cfg.run_id, "steps": state.step, "start_step": start_step,
        # NaN (nothing trained) and +-Infinity (diverged) are not valid JSON
        "final_loss": loss_val if math.isfinite(loss_val) else None,
        "tokens_seen": state.tokens_seen, "mean_tokens_per_second": float(np.mean(throughput)) if throughput else None,
        "wall_seconds": time.perf_counter() - t_start, "world_size": rt.world_size, "strategy": cfg.strategy,
        "model": cfg.model, "last_checkpoint_step": last_saved, "stopped_by_sigterm": stopped_by_sigterm,
        "checkpoints_saved": checkpoints_saved, "checkpoint_seconds": checkpoint_seconds,
        "replica_checksums": checksums,
    })
    # Every rank exits the same way, whichever of them got the signal.
    return EXIT_SIGTERM if stopped_by_sigterm and state.step < cfg.max_steps else 0


def young_daly_interval(save_s: float, step_times: list[float], mtbf_hours: float, rt: Runtime) -> int:
    """Steps between checkpoints that minimise expected lost time: sqrt(2 * C * MTBF) (Young 1974; Daly 2006),
    C the save's stall. The slowest rank's figures, agreed by one all-reduce, so every rank saves at the same steps."""
    times = sorted(step_times[1:] or step_times)  # the first step after a (re)start includes warm-up
    measured = torch.tensor([save_s, times[len(times) // 2]], dtype=torch.float64, device=rt.device)
    dist.all_reduce(measured, op=dist.ReduceOp.MAX)
    save_s, step_s = measured.tolist()
    seconds = math.sqrt(2 * save_s * mtbf_hours * 3600)
    steps = max(1, round(seconds / step_s))
    if rt.is_main:
        log(f"checkpoint: every {steps} steps (Young/Daly: sqrt(2 x {save_s:.3g} s per save x {mtbf_hours:g} h "
            f"MTBF) = {seconds:.0f} s at {step_s:.3g} s per step)")
    return steps


def divergence(loss: float, grad_norm: float, lowest: float, spike_factor: float) -> str | None:
    """Why this step counts as diverged, or None."""
    if not math.isfinite(loss):
        return f"loss {loss}"
    if not math.isfinite(grad_norm):
        return f"gradient norm {grad_norm}"
    if spike_factor and math.isfinite(lowest) and loss > spike_factor * max(lowest, 1e-3):
        return f"loss {loss:.4g} is more than {spike_factor:g} times its lowest value {lowest:.4g}"
    return None


def raise_diverged(cfg: TrainConfig, step: int, reason: str, last_saved: int, rt: Runtime):
    resume = f"step {last_saved}" if last_saved >= 0 else "no checkpoint"
    if rt.is_main:
        marker = Path(cfg.checkpoint_dir) / DIVERGED_MARKER
        record = {"step": step, "reason": reason, "last_checkpoint_step": last_saved, "config": diverged_config(cfg)}
        tmp = marker.with_name(f".{marker.name}.tmp")
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(tmp, marker)
    raise RunRefused(EXIT_DIVERGED, f"diverged at step {step}: {reason}; stopped without saving, the newest "
                                    f"checkpoint is {resume} (from before the divergence)" if rt.is_main else "")


def take_folder(root: Path, rt: Runtime):
    """One writer per checkpoint folder: global rank 0 takes the lock and every rank learns the outcome.

    Held by the rank-0 worker process, so the kernel releases it when that worker dies; torchrun's restart
    takes it again. Another job on the same folder is refused with the holder's name and exit code 5, at once when
    it is another run, after a bounded wait when it is this run's own earlier attempt (its host may have died)."""
    got = lock_folder_waiting(root, lock_holder()) if rt.is_main else None
    refused = torch.tensor([int(isinstance(got, str))], dtype=torch.int32, device=rt.device)
    dist.broadcast(refused, src=0)
    if int(refused.item()):
        raise RunRefused(EXIT_FOLDER_LOCKED, f"--checkpoint-dir={str(root)!r} is in use by another job "
                                             f"(holder: {got}); one writer per checkpoint folder" if rt.is_main else "")
    return got


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        fields = {k: v for k, v in vars(args).items() if k in TrainConfig.__dataclass_fields__}
        cfg = TrainConfig(**{**fields, "data": data_dir(args), "checkpoint_dir": checkpoint_dir(args, "--checkpoint-dir")})
        nodes_problem = expected_nodes_error(args.expected_nodes)
        if nodes_problem:
            raise UsageError("--expected-nodes", args.expected_nodes, nodes_problem, "the job's node count")
        resolve_device(cfg.device)
        check_data(Path(cfg.data), cfg.model_config())
        check_not_diverged(cfg)
        # Before any process group exists: a wrong or unwritable --checkpoint-dir fails in one line.
        check_reusable(Path(cfg.checkpoint_dir), cfg.strategy, cfg.model, asdict(cfg.model_config()))
        probe_writable(Path(cfg.checkpoint_dir))
        try:
            return train(cfg)
        finally:
            destroy_distributed()  # always, so a failing rank does not leave peers waiting on a dead group
    except UsageError as err:
        exit_with_usage_error("train.py", err)
    except RunRefused as err:
        exit_refused("train.py", err)


if __name__ == "__main__":
    sys.exit(main())

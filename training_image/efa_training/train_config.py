"""train.py's settings, shared by both workloads: one typed dataclass, validated in `__post_init__`, and the command
line derived from it (runtime/settings.py).

Each field carries its flag's help text in its metadata (and, for the two paths, the environment variable the flag
defaults to), so every default is written once, on the field, and the parser reads it from there. The
infrastructure's defaults for the same settings are contracts/run.py's; tests/training/test_run_contract.py holds
the two equal (the image cannot import contracts/: its Docker build context is training_image/ only).
The parameter-server fields (ps_servers_per_node, staleness) are the ctr-ps workload's; the others ignore them.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, fields
from pathlib import Path

from efa_training.checkpointing.schedule import FIRST_AUTO_SAVE
from efa_training.runtime.distributed import DEVICES
from efa_training.runtime.errors import UsageError
from efa_training.runtime.run_paths import add_layout_flags, checkpoint_dir, data_dir
from efa_training.runtime.settings import add_flags, flag, setting
from efa_training.workloads.ctr_ps.model import CTR_SIZES
from efa_training.workloads.gpt.sizes import MODEL_SIZES, ModelConfig, model_config

STRATEGIES = ("ddp", "fsdp", "ps")
UNBOUNDED = -1  # --staleness: asynchronous, no bound
NO_INITIAL_MODEL = "none"  # contracts/run.py NO_INITIAL_MODEL (tests hold them equal)
COUNTS = (
    "max_steps",
    "keep_last",
    "micro_batch_size",
    "grad_accum_steps",
    "log_every",
    "ps_servers_per_node",
    "tensor_parallel",
    "pipeline_parallel",
)  # each at least 1
# Every float must be finite (argparse accepts nan and inf) and in range: (low, high, whether low itself is allowed).
FLOAT_RANGES = {
    "lr": (0.0, 1.0, False),
    "min_lr_ratio": (0.0, 1.0, True),
    "weight_decay": (0.0, 10.0, True),
    "grad_clip": (0.0, 1e6, True),
    "loss_spike_factor": (0.0, 1e6, True),
    "mtbf_hours": (0.0, 1e6, False),
}


UNNAMED_RUN = "local"  # --run-id's default where env RUN_ID is unset too: a run given no id (run_paths.py alike)


def _run_id_from_env() -> str:
    return os.environ.get("RUN_ID", UNNAMED_RUN)


@dataclass
class TrainConfig:
    data: str = setting(
        env="DATA_DIR",
        help="directory of train_*.bin/val_*.bin shards from prepare_data.py "
        "(default: env DATA_DIR, else --datasets-root/--dataset)",
    )
    checkpoint_dir: str = setting(
        env="CHECKPOINT_DIR",
        help="where checkpoints go; the newest loadable one here is "
        "resumed automatically (default: env CHECKPOINT_DIR, else "
        "--checkpoints-root/--run-id)",
    )
    max_steps: int = setting(help="optimizer steps to train for (>= 1)")
    checkpoint_every: int = setting(
        0,
        help="save every K steps, plus at the last step and on SIGTERM; 0: the "
        "Young/Daly interval sqrt(2 * save time * MTBF), measured at a first save after "
        f"{FIRST_AUTO_SAVE} steps",
    )
    mtbf_hours: float = setting(
        24.0,
        help="mean time between failures of the whole job, for --checkpoint-every 0 (lower it for Spot or many nodes)",
    )
    keep_last: int = setting(3, help="number of newest checkpoints to keep")
    seed: int = setting(1337, help="seed for init, data order and RNG")
    strategy: str = setting(
        "ddp",
        help="ddp (replicated), fsdp (FSDP2 fully_shard, DCP checkpoints) or ps (parameter servers, for the sparse "
        "ctr-* models; workloads/ctr_ps/)",
    )
    model: str = setting(
        "tiny", help=f"model size: {', '.join(MODEL_SIZES)}; with --strategy ps: {', '.join(CTR_SIZES)}"
    )
    seq_len: int = setting(0, help="context length; 0 uses the model size's default")
    tensor_parallel: int = setting(
        1,
        help="tensor-parallel degree (--strategy fsdp): each block split over this many consecutive ranks, one node's "
        "accelerators or a divisor of them, FSDP2 over the rest (workloads/gpt/parallel.py); 1: none",
    )
    pipeline_parallel: int = setting(
        1,
        help="pipeline-parallel degree (--strategy fsdp): the layers cut into this many stages of consecutive ranks, "
        "the step's micro-batches (or its sequences cut into as many parts as stages) passed between them by a 1F1B "
        "schedule (workloads/gpt/pipeline.py); 1: none",
    )
    micro_batch_size: int = setting(8, aliases=("--batch-size",), help="sequences per process per micro-step")
    grad_accum_steps: int = setting(
        1, help="micro-steps per optimizer step; gradients are synchronised on the last only"
    )
    lr: float = setting(3e-4, help="peak learning rate")
    min_lr_ratio: float = setting(0.1, help="cosine decays to lr*ratio at --max-steps")
    warmup_steps: int = setting(100, help="linear warm-up steps before the cosine decay")
    weight_decay: float = setting(0.1, help="AdamW weight decay on matrices")
    grad_clip: float = setting(1.0, help="clip the global gradient norm to this; 0 disables")
    loss_spike_factor: float = setting(
        10.0,
        help="stop as diverged (exit 4) when the loss exceeds this many times "
        "its lowest value in this run; a non-finite loss or gradient norm always stops "
        "it; 0 disables the spike test",
    )
    device: str = setting("auto", help="auto (from ACCELERATOR_KIND, else cuda if present, else cpu), cuda, cpu or xla")
    compile: bool = setting(False, help="torch.compile the model (off by default)")
    run_id: str = setting(
        default_factory=_run_id_from_env,
        help="RunId dimension of the metrics; names the "
        "checkpoint dir under --checkpoints-root (default: env RUN_ID, else 'local')",
    )
    log_every: int = setting(1, help="emit a metrics line every N steps")
    init_from: str = setting(
        NO_INITIAL_MODEL,
        help="start from the weights (not the optimizer, step or data position) of another run's newest loadable "
        "checkpoint when this run has none of its own: a run id (its folder under --init-checkpoints-root) or a "
        f"folder; {NO_INITIAL_MODEL!r}: from scratch",
    )
    ps_servers_per_node: int = setting(1, help="--strategy ps: parameter-server processes on every node (>= 1)")
    staleness: int = setting(
        4,
        help="--strategy ps: how many more of its updates a worker may have applied than the slowest worker; "
        f"0 synchronous, {UNBOUNDED} unbounded (asynchronous)",
    )
    init_checkpoints_root: str = setting(
        default_factory=str,  # "": the folder that holds this run's --checkpoint-dir
        help="where --init-from's run id is looked up (default: the folder that holds this run's --checkpoint-dir)",
    )

    def __post_init__(self) -> None:
        self._check_counts()
        self._check_names()
        self._check_seq_len()
        self._check_layout()
        self._check_floats()
        ckpt = Path(self.checkpoint_dir)
        if ckpt.exists() and not ckpt.is_dir():
            raise UsageError("--checkpoint-dir", self.checkpoint_dir, "is a file", "a directory (created if missing)")

    def _check_counts(self) -> None:
        for name in COUNTS:
            if getattr(self, name) < 1:
                raise UsageError(flag(name), getattr(self, name), "must be at least 1", ">= 1")
        if self.checkpoint_every < 0:
            raise UsageError("--checkpoint-every", self.checkpoint_every, "negative", "0 (Young/Daly) or >= 1")
        if self.warmup_steps < 0:
            raise UsageError("--warmup-steps", self.warmup_steps, "negative", ">= 0")
        if not UNBOUNDED <= self.staleness <= 1_000_000:
            raise UsageError(
                "--staleness", self.staleness, "out of range", f"0 (synchronous) to 1000000, or {UNBOUNDED}"
            )

    def _check_names(self) -> None:
        if self.strategy not in STRATEGIES:
            raise UsageError("--strategy", self.strategy, "unknown strategy", "|".join(STRATEGIES))
        sizes = CTR_SIZES if self.strategy == "ps" else MODEL_SIZES  # the sparse models train on parameter servers
        if self.model not in sizes:
            other = "--strategy ps" if self.model in CTR_SIZES else "--strategy ddp or fsdp"
            known = self.model in CTR_SIZES or self.model in MODEL_SIZES
            raise UsageError(
                "--model",
                self.model,
                f"trains with {other}" if known else "unknown model size",
                f"with --strategy {self.strategy}: {', '.join(sizes)}",
            )
        if self.device not in DEVICES:
            raise UsageError("--device", self.device, "unknown device", ", ".join(DEVICES))

    def _check_layout(self) -> None:
        """What --tensor-parallel and --pipeline-parallel need of the run alone (the world size and the node's
        accelerators: preflight.py): FSDP2, and a degree that divides the model's heads, or its layers."""
        mcfg = self.model_config() if self.strategy != "ps" else None
        for name, value, parts, what in (
            ("--tensor-parallel", self.tensor_parallel, mcfg.n_head if mcfg else 1, "heads"),
            ("--pipeline-parallel", self.pipeline_parallel, mcfg.n_layer if mcfg else 1, "layers"),
        ):
            if value == 1:
                continue
            if self.strategy != "fsdp":
                raise UsageError(name, value, f"needs --strategy fsdp, not {self.strategy}", "1 with ddp")
            if parts % value:
                raise UsageError(
                    name,
                    value,
                    f"does not divide the {parts} {what} of model {self.model}",
                    f"a divisor of the {what}: " + ", ".join(str(d) for d in range(1, parts + 1) if parts % d == 0),
                )

    def _check_seq_len(self) -> None:
        if self.strategy == "ps":
            if self.seq_len or self.grad_accum_steps != 1:
                raise UsageError(
                    "--seq-len/--grad-accum-steps",
                    (self.seq_len, self.grad_accum_steps),
                    "not used by --strategy ps",
                    "0 and 1",
                )
            return
        context = MODEL_SIZES[self.model].seq_len
        if not 0 <= self.seq_len <= context:
            # The learned position table is the model size's context; longer steps also outlast the stop grace.
            raise UsageError(
                "--seq-len",
                self.seq_len,
                f"outside the {self.model} model's context of {context} positions",
                f"0 (= {context}) to {context}",
            )

    def _check_floats(self) -> None:
        for name, (low, high, low_ok) in FLOAT_RANGES.items():
            value = getattr(self, name)
            if not (math.isfinite(value) and (low <= value if low_ok else low < value) and value <= high):
                raise UsageError(
                    flag(name), value, "not finite or out of range", f"{'' if low_ok else 'more than '}{low} to {high}"
                )
        if 0 < self.loss_spike_factor <= 1:
            raise UsageError("--loss-spike-factor", self.loss_spike_factor, "would stop on any noise", "0 (off) or > 1")

    def model_config(self) -> ModelConfig:
        return model_config(self.model, seq_len=self.seq_len or None)

    def named_run_id(self) -> str:
        """The run's id as its backend gave it (Batch and EKS: --run-id; SageMaker: env RUN_ID), "" for a run given
        none: what the checkpoint folder's lock records, so a retry tells its own earlier attempt from another run."""
        # Batch: the job definition's `--run-id Ref::run_id` ("The Ref:: declarations in the command section are used
        # to set placeholders for parameter substitution", https://docs.aws.amazon.com/batch/latest/userguide/example-use-parameters.html).
        return "" if self.run_id == UNNAMED_RUN else self.run_id

    def initial_model_dir(self) -> Path | None:
        """The folder of checkpoints --init-from names, or None (from scratch)."""
        if self.init_from in ("", NO_INITIAL_MODEL):
            return None
        if "/" in self.init_from:
            return Path(self.init_from)
        root = Path(self.init_checkpoints_root) if self.init_checkpoints_root else Path(self.checkpoint_dir).parent
        return root / self.init_from


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """train.py's command line: one flag per TrainConfig field, plus where the data and checkpoints are."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(p, TrainConfig)
    add_layout_flags(p)
    p.add_argument(
        "--expected-nodes",
        type=int,
        default=None,
        help="refuse to start unless torchrun's node count (GROUP_WORLD_SIZE) equals this",
    )
    return p


def from_args(args: argparse.Namespace) -> TrainConfig:
    """The config of parsed flags, with the data and checkpoint folders resolved from the pipeline's layout."""
    given = {f.name: getattr(args, f.name) for f in fields(TrainConfig)}
    return TrainConfig(**{**given, "data": data_dir(args), "checkpoint_dir": checkpoint_dir(args, "--checkpoint-dir")})

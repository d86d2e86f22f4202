"""A plain PyTorch model-parallel script that follows the platform's workload contract (docs/workloads.md): nothing
in it imports the platform. A residual MLP block (a transformer's feed-forward half) learns a fixed random teacher
on a 2-D device mesh (dp, tp): tensor parallelism on the inner "tp" dimension (inside a node: the ranks of a tp group
are consecutive, so NVLink on GPUs) and FSDP2 on the outer "dp" dimension (across nodes: EFA). This file is the
contract's side, standard library only until the input is checked; model_parallel.py is the PyTorch side.

- ranks and rendezvous: torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, ...), gloo on CPU, NCCL on GPUs;
- hyperparameters: the JSON file HYPERPARAMETERS_FILE names (lr, max_steps, checkpoint_every, tp);
- checkpoints: torch.distributed.checkpoint (every rank writes its shards) into CHECKPOINT_DIR/step_<n>; rank 0 then
  names the newest complete one in CHECKPOINT_DIR/latest (written atomically), which the next attempt resumes from;
- stop: on SIGTERM, every rank stops at the same step, saves, exit 0 (the next attempt resumes);
- exit 2 for a bad hyperparameter or a tp that does not divide the world size (the pipeline does not retry it),
  anything else is an attempt failure;
- metrics: prints `step=<n> loss=<value>` on global rank 0, which the declaration's regex reads.
"""

import json
import os
import signal
import sys
from pathlib import Path
from typing import NoReturn

HIDDEN = 64  # the block's hidden width, split across the tp ranks (evaluate.py builds the same block)
DEFAULTS = {"lr": 0.01, "max_steps": 200, "checkpoint_every": 20, "tp": 2}


def refuse(reason: str) -> NoReturn:
    """Exit 2 (the input is wrong: not retried), with the reason on stderr from every rank: torchrun stops the
    others as soon as the first one exits, so a line from rank 0 alone was lost whenever another rank got there
    first (seen once in CI under load)."""
    print(f"train.py: {reason}", file=sys.stderr, flush=True)
    sys.exit(2)


def hyperparameters(world_size: int) -> dict:
    text = Path(os.environ["HYPERPARAMETERS_FILE"]).read_text()
    try:
        given = json.loads(text)
    except ValueError:
        given = None
    if not isinstance(given, dict):
        refuse(f"the hyperparameters are not a JSON object: {text[:60]!r}")
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        refuse(f"unknown hyperparameters {unknown}; expected some of {sorted(DEFAULTS)}")
    values = DEFAULTS | given

    def integer(name: str) -> bool:
        return isinstance(values[name], int) and not isinstance(values[name], bool) and values[name] >= 1

    lr_ok = isinstance(values["lr"], (int, float)) and not isinstance(values["lr"], bool) and 0 < values["lr"] <= 1
    if not lr_ok or not all(integer(name) for name in ("max_steps", "checkpoint_every", "tp")):
        refuse(f"bad hyperparameters {values}; expected 0 < lr <= 1 and integers >= 1")
    if world_size % values["tp"]:
        refuse(f"tp={values['tp']} does not divide WORLD_SIZE={world_size}")
    if HIDDEN % values["tp"]:
        refuse(f"tp={values['tp']} does not divide the hidden width {HIDDEN}")
    return values


def main() -> int:
    stop: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    hyper = hyperparameters(int(os.environ["WORLD_SIZE"]))
    # PyTorch only now: importing it takes seconds in every process, which a refused job need not spend.
    import model_parallel

    model_parallel.train(hyper, HIDDEN, stop)
    # End without interpreter finalization: gloo's threads can abort a finished process at exit ("terminate called
    # without an active exception", pytorch/pytorch#179291); the checkpoint is complete before this.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())

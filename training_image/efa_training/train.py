r"""Train a GPT-style decoder with DDP or FSDP2 on CUDA/NCCL, CPU/gloo or Trainium/XLA.

Launch (elastic, restarts on failure, resumes from the newest good checkpoint); the paths are the pipeline's
layout on the shared file system (config/layout.py: /fsx/datasets/<dataset>, /fsx/checkpoints/<run id>):
    torchrun --nnodes 1:4 --nproc-per-node 8 --max-restarts 3 \
        --rdzv-backend c10d --rdzv-endpoint $MAIN_ADDR:29500 --rdzv-id $RUN_ID \
        -m efa_training.train --data /fsx/datasets/wikitext --checkpoint-dir /fsx/checkpoints/run-7 \
                 --model 1.3b --strategy fsdp --max-steps 20000 --checkpoint-every 500
CPU, two processes (what the tests do):
    torchrun --nproc-per-node 2 -m efa_training.train --data d --checkpoint-dir c --model tiny --max-steps 50
In the container, `launch.py train ...` builds the torchrun line from Batch/EKS variables.

The settings are train_config.py's; the workload (workloads/__init__.py) is the strategy's: the loop and the
refusals before start are workloads/gpt/'s, or with --strategy ps the parameter servers of workloads/ctr_ps/.
"""

from __future__ import annotations

import argparse
import sys

from efa_training import train_config, workloads
from efa_training.runtime.errors import RunRefused, UsageError, exit_process, exit_refused, exit_with_usage_error


def build_parser() -> argparse.ArgumentParser:
    return train_config.build_parser(__doc__)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = train_config.from_args(args)
        return workloads.train(cfg, args.expected_nodes, sys.argv[1:] if argv is None else argv)
    except UsageError as err:
        exit_with_usage_error("train.py", err)
    except RunRefused as err:
        exit_refused("train.py", err)


if __name__ == "__main__":
    exit_process(main())

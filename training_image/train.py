r"""Train a GPT-style decoder with DDP or FSDP2 on CUDA/NCCL, CPU/gloo or Trainium/XLA.

Launch (elastic, restarts on failure, resumes from the newest good checkpoint); the paths are the pipeline's
layout on the shared file system (config/layout.py: /fsx/datasets/<dataset>, /fsx/checkpoints/<run id>):
    torchrun --nnodes 1:4 --nproc-per-node 8 --max-restarts 3 \
        --rdzv-backend c10d --rdzv-endpoint $MAIN_ADDR:29500 --rdzv-id $RUN_ID \
        train.py --data /fsx/datasets/wikitext --checkpoint-dir /fsx/checkpoints/run-7 \
                 --model 1.3b --strategy fsdp --max-steps 20000 --checkpoint-every 500
CPU, two processes (what the tests do):
    torchrun --nproc-per-node 2 train.py --data d --checkpoint-dir c --model tiny --max-steps 50
In the container, `launch.py train ...` builds the torchrun line from Batch/EKS variables.

The settings are train_config.py's, the loop trainer.py's, the refusals before start preflight.py's.
"""

from __future__ import annotations

import argparse
import os
import sys

import train_config
from distributed import destroy_distributed, init_distributed
from errors import RunRefused, UsageError, exit_process, exit_refused, exit_with_usage_error
from preflight import check_before_start
from trainer import Trainer


def build_parser() -> argparse.ArgumentParser:
    return train_config.build_parser(__doc__)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = train_config.from_args(args)
        if cfg.strategy == "ps":  # parameter servers: their own processes, not torchrun's (ps_supervisor.py)
            return _parameter_servers(cfg, args, sys.argv[1:] if argv is None else argv)
        check_before_start(cfg, args.expected_nodes)
        try:
            return Trainer(cfg, init_distributed(cfg.device)).fit()
        finally:
            destroy_distributed()  # always, so a failing rank does not leave peers waiting on a dead group
    except UsageError as err:
        exit_with_usage_error("train.py", err)
    except RunRefused as err:
        exit_refused("train.py", err)


def _parameter_servers(cfg: train_config.TrainConfig, args: argparse.Namespace, argv: list[str]) -> int:
    import ps
    import ps_supervisor

    if "PS_ROLE" in os.environ:  # a process the supervisor started
        return ps.run_role(cfg, ps.Layout.from_env(dict(os.environ)))
    check_before_start(cfg, args.expected_nodes)
    return ps_supervisor.supervise(argv, cfg.ps_servers_per_node, dict(os.environ))


if __name__ == "__main__":
    exit_process(main())

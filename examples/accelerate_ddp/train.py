"""A Hugging Face Accelerate script launched by its own per-node launcher (`accelerate launch`, the declaration's
`"launch": "per-node"`), following the platform's workload contract (docs/workloads.md); nothing in it imports the
platform. It fits y = 3x - 1 with a one-layer model on generated data.

- ranks: `accelerate launch` sets each worker's from the node's place the platform gives (NODE_RANK, NNODES,
  NPROC_PER_NODE, MASTER_ADDR, MASTER_PORT: the declaration's command passes them on);
- hyperparameters: HYPERPARAMETERS_FILE (lr, max_steps, checkpoint_every); a bad one exits 2 (not retried) from
  `train.py --check`, which the declared command runs before `accelerate launch`: a worker's own 2 would reach the
  job as the launcher's 1 (torchrun's elastic agent ends 1 when a worker fails), an attempt failure, retried;
- resume: `Accelerator.load_state` from the folder CHECKPOINT_DIR/latest names; `save_state` writes each checkpoint
  into a folder of its own and `latest` is replaced (os.replace) once every rank wrote its part: complete or absent;
- stop: on SIGTERM every rank stops at the same step and saves; exit 0 (the launcher reports it as stopped, 143);
- metrics: prints `step=<n> loss=<value>`, which the declaration's regex reads.
"""

import json
import os
import shutil
import signal
import sys
from pathlib import Path

import torch
from accelerate import Accelerator


def hyperparameters() -> dict:
    values = {"lr": 0.05, "max_steps": 200, "checkpoint_every": 20}
    values |= json.loads(Path(os.environ["HYPERPARAMETERS_FILE"]).read_text())
    if not 0 < values["lr"] <= 1 or values["max_steps"] < 1 or values["checkpoint_every"] < 1:
        print(f"train.py: bad hyperparameters {values}", file=sys.stderr)
        sys.exit(2)
    return values


def main() -> int:
    hyper = hyperparameters()
    if "--check" in sys.argv[1:]:  # the node's own process, before the launcher: its 2 is the job's
        return 0
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    torch.manual_seed(1234 + accelerator.process_index)
    net = torch.nn.Linear(1, 1)
    model, optimizer = accelerator.prepare(net, torch.optim.SGD(net.parameters(), lr=hyper["lr"]))
    folder, step = Path(os.environ["CHECKPOINT_DIR"]), 0
    if (folder / "latest").is_file():
        step = int((folder / "latest").read_text())
        accelerator.load_state(str(folder / f"step-{step}"))
        accelerator.print(f"resumed from step={step}")
    stop: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    stopped = False
    while step < hyper["max_steps"] and not (stopped := stopping(accelerator, stop)):
        x = torch.rand(64, 1, device=accelerator.device) * 2 - 1
        loss = torch.nn.functional.mse_loss(model(x), 3 * x - 1)
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        step += 1
        if step % 10 == 0:
            accelerator.print(f"step={step} loss={loss.item():.6f}", flush=True)
        if step % hyper["checkpoint_every"] == 0 or step == hyper["max_steps"]:
            save(accelerator, model, folder, step)
    if stopped:  # the reduced flag: every rank saves together, not only those the signal reached
        save(accelerator, model, folder, step)
        accelerator.print(f"stopped at step={step}: saved", flush=True)
    accelerator.end_training()
    return 0


def stopping(accelerator: Accelerator, stop: list) -> bool:
    """Every rank stops at the same step: a SIGTERM seen by any rank stops them all (the flag's maximum)."""
    flag = torch.tensor([1.0 if stop else 0.0], device=accelerator.device)
    return bool(accelerator.reduce(flag, reduction="sum").item())


def save(accelerator: Accelerator, model, folder: Path, step: int) -> None:
    """The state into `step-<n>/`, then `latest` names it (rank 0, once every rank wrote its part), the model's weights
    beside it for the validation; older folders are removed."""
    target = folder / f"step-{step}"
    accelerator.save_state(str(target))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        torch.save(accelerator.unwrap_model(model).state_dict(), target / "model.pt")
        (folder / "latest.partial").write_text(str(step))
        os.replace(folder / "latest.partial", folder / "latest")  # atomic on one file system (POSIX rename)
        for old in folder.glob("step-*"):
            if old != target:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    sys.exit(main())

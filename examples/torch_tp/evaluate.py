"""Validation for train.py under the workload contract, in one process: the newest checkpoint (written sharded over
a dp x tp mesh) loaded into a plain, unsharded model, its mean squared error on held-out generated data written as
MODEL_DIR/metrics.json {"eval_loss": ...}, and the plain model's state dict beside it (MODEL_DIR/model.pt).

torch.distributed.checkpoint reshards on load: with no process group it reads every shard of each tensor the plain
state dict asks for into that one tensor, so the layout the checkpoint was written in does not matter here."""

import json
import os
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from model_parallel import Block, batch, latest
from train import HIDDEN

HOLDOUT_SEED = 2**62  # far beyond every seed training draws its batches from (model_parallel.train_seed)
HOLDOUT_SIZE = 1024


def main() -> int:
    folder = latest(Path(os.environ["CHECKPOINT_DIR"]))
    if folder is None or not folder.is_dir():
        print(f"evaluate.py: no complete checkpoint in {os.environ['CHECKPOINT_DIR']}", file=sys.stderr)
        return 2
    model = Block(HIDDEN)
    state = {"model": model.state_dict()}  # only the model: the optimizer's state stays in the checkpoint
    with warnings.catch_warnings():  # "torch.distributed is ... uninitialized, assuming ... a single process": it is
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(state, checkpoint_id=folder, no_dist=True)
    model.load_state_dict(state["model"])
    x, y = batch(HOLDOUT_SEED, HOLDOUT_SIZE)
    with torch.no_grad():
        eval_loss = torch.nn.functional.mse_loss(model(x), y).item()
    out = Path(os.environ["MODEL_DIR"])
    torch.save(model.state_dict(), out / "model.pt")
    (out / "metrics.json").write_text(json.dumps({"eval_loss": eval_loss}))
    print(f"evaluated {folder.name}: eval_loss={eval_loss:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

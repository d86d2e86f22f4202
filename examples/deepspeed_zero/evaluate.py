"""Validation for train.py under the workload contract, in one process and without a DeepSpeed engine: the full model
rebuilt from the ZeRO shards of the newest checkpoint (the tag CHECKPOINT_DIR/latest names) by DeepSpeed's
zero_to_fp32, its mean squared error on a holdout no training batch comes from, written as MODEL_DIR/metrics.json
{"eval_loss": ...}, and its state dict beside it as model.pt (plain PyTorch: loading it needs no DeepSpeed)."""

import json
import os
import sys
from pathlib import Path

import torch
from task import HOLDOUT_SEED, HOLDOUT_SIZE, batch, build_model


def main() -> int:
    checkpoints = Path(os.environ["CHECKPOINT_DIR"])
    if not (checkpoints / "latest").is_file():
        print(f"evaluate.py: no checkpoint at {checkpoints} (no 'latest' file)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"  # read when deepspeed is first imported
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint  # type: ignore[import-untyped]

    model = build_model()
    model.load_state_dict(get_fp32_state_dict_from_zero_checkpoint(str(checkpoints)))  # fp32, on the CPU
    x, y = batch(HOLDOUT_SEED, HOLDOUT_SIZE)
    with torch.no_grad():
        eval_loss = torch.nn.functional.mse_loss(model(x), y).item()
    out = Path(os.environ["MODEL_DIR"])
    torch.save(model.state_dict(), out / "model.pt")
    (out / "metrics.json").write_text(json.dumps({"eval_loss": eval_loss}))
    print(f"eval_loss={eval_loss:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

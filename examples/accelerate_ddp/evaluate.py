"""Validation for train.py under the workload contract: the mean squared error of the newest checkpoint's model on a
fixed holdout, written as MODEL_DIR/metrics.json {"eval_loss": ...}, and the model beside it. One process: no
launcher needed."""

import json
import os
import sys
from pathlib import Path

import torch


def main() -> int:
    folder = Path(os.environ["CHECKPOINT_DIR"])
    if not (folder / "latest").is_file():
        print(f"evaluate.py: no checkpoint in {folder}", file=sys.stderr)
        return 2
    model = torch.nn.Linear(1, 1)
    model.load_state_dict(torch.load(folder / f"step-{(folder / 'latest').read_text()}" / "model.pt"))
    x = torch.linspace(-1, 1, 101).unsqueeze(1)
    with torch.no_grad():
        eval_loss = torch.nn.functional.mse_loss(model(x), 3 * x - 1).item()
    out = Path(os.environ["MODEL_DIR"])
    torch.save(model.state_dict(), out / "model.pt")
    (out / "metrics.json").write_text(json.dumps({"eval_loss": eval_loss}))
    print(f"eval_loss={eval_loss:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

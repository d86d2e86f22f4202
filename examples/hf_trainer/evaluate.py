"""Validation for train.py under the workload contract: the causal-LM loss of the newest complete checkpoint on
held-out generated sequences (another seed than training's), written as MODEL_DIR/metrics.json {"eval_loss": ...},
and the model beside it (save_pretrained: config.json and model.safetensors). One process."""

import json
import math
import os
import sys
from pathlib import Path

import torch
from train import SEQUENCE_LENGTH, newest_complete_checkpoint, sequences

HOLDOUT_SEED, HOLDOUT_SEQUENCES = 1, 512


def main() -> int:
    checkpoint = newest_complete_checkpoint(Path(os.environ["CHECKPOINT_DIR"]))
    if checkpoint is None:
        print(f"evaluate.py: no complete checkpoint-* in {os.environ['CHECKPOINT_DIR']}", file=sys.stderr)
        return 2
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = GPT2LMHeadModel.from_pretrained(checkpoint)  # a local folder: nothing is downloaded
    model.loss_type = "ForCausalLM"
    model.eval()
    holdout = sequences(HOLDOUT_SEQUENCES, HOLDOUT_SEED)
    total, predicted = 0.0, 0
    with torch.no_grad():
        for batch in holdout.split(64):
            loss = model(input_ids=batch, labels=batch).loss.item()  # the mean over the batch's predicted tokens
            count = batch.shape[0] * (SEQUENCE_LENGTH - 1)
            total, predicted = total + loss * count, predicted + count
    eval_loss = total / predicted
    out = Path(os.environ["MODEL_DIR"])
    model.save_pretrained(out)
    (out / "metrics.json").write_text(json.dumps({"eval_loss": eval_loss if math.isfinite(eval_loss) else None}))
    print(f"evaluated {checkpoint.name}: eval_loss={eval_loss:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

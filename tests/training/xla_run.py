"""Run the training image's train.py on PyTorch/XLA's CPU device and record what the XLA path did.

Run by tests/training/test_xla_path.py with the XLA environment's Python (.venv-xla, PJRT_DEVICE=CPU):

    xla_run.py OUT.json -- <train.py flags>

It wraps, without changing them, the XLA calls the training loop makes and writes OUT.json:
  events:    the order of optimizer steps, mark_step calls (and who called them) and batches from the device loader
  compiles:  PyTorch/XLA's own count of graph compilations (debug.metrics "UncachedCompile") after each step
  batches:   the shape and device type of each batch the device loader handed over
  losses:    the loss of each step, as the trainer computed it
  params:    the final parameters (name -> list), for the checkpoint portability tests
  start_params: the parameters once the trainer is built (resumed from a checkpoint where there is one)
  tied:      whether the model's output head is still its token embedding on the device
`XLA_RUN_DYNAMIC_SHAPES=1` gives every batch a sequence length of its own: a dynamic shape the no-recompilation
check must catch.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "training_image"))

import torch  # noqa: E402
import torch_xla.core.xla_model as xm  # noqa: E402
import torch_xla.debug.metrics as met  # noqa: E402
import torch_xla.distributed.parallel_loader as parallel_loader  # noqa: E402

import trainer  # noqa: E402

record: dict = {"events": [], "compiles": [], "batches": [], "losses": [], "params": {}, "start_params": {}}


def _compiles() -> int:
    return int(met.counter_value("UncachedCompile") or 0)


original_mark_step = xm.mark_step


def mark_step(*args, **kwargs):
    caller = sys._getframe(1).f_code.co_name
    if caller == "mark_step":  # Runtime.mark_step: name who called the runtime
        caller = sys._getframe(2).f_code.co_name
    record["events"].append(f"mark_step:{caller}")
    return original_mark_step(*args, **kwargs)


xm.mark_step = mark_step

OriginalLoader: Any = parallel_loader.MpDeviceLoader


class RecordingLoader(OriginalLoader):
    def __iter__(self):
        for batch in super().__iter__():
            x = batch[0]
            record["events"].append("batch")
            record["batches"].append({"shape": list(x.shape), "device": x.device.type})
            yield batch


parallel_loader.MpDeviceLoader = RecordingLoader

if os.environ.get("XLA_RUN_DYNAMIC_SHAPES") == "1":
    import data

    original_next = data.SequenceBatches.__next__

    def shrinking(self):
        # A new sequence length for every batch (as a loader that packs documents without padding would give).
        x, y = original_next(self)
        cut = 1 + (self.position // (self.spec.world_size * self.spec.micro_batch)) % (x.shape[1] // 2)
        return x[:, :-cut], y[:, :-cut]

    data.SequenceBatches.__next__ = shrinking  # type: ignore[method-assign]

original_train_step = trainer.Trainer.train_step


def train_step(self):
    original_step = self.optimizer.step

    def step(*args, **kwargs):
        record["events"].append("optimizer.step")
        return original_step(*args, **kwargs)

    self.optimizer.step = step
    try:
        result = original_train_step(self)
    finally:
        self.optimizer.step = original_step
    record["losses"].append(result.loss)
    record["compiles"].append(_compiles())
    record["events"].append("step_end")
    if self.state.step == self.cfg.max_steps:
        record["params"] = _parameters(self.model)
    return result


trainer.Trainer.train_step = train_step  # type: ignore[method-assign]
original_init = trainer.Trainer.__init__


def init(self, *args, **kwargs):
    original_init(self, *args, **kwargs)
    record["start_params"] = _parameters(self.model)
    record["tied"] = self.model.lm_head.weight is self.model.tok_emb.weight


def _parameters(model) -> dict:
    return {name: p.detach().cpu().double().flatten().tolist() for name, p in model.named_parameters()}


trainer.Trainer.__init__ = init  # type: ignore[method-assign]


def main() -> int:
    out, rest = Path(sys.argv[1]), sys.argv[2:]
    if rest[:1] == ["--"]:
        rest = rest[1:]
    import train

    try:
        code = train.main(rest)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    record["exit_code"] = code
    record["torch"] = torch.__version__
    out.write_text(json.dumps(record))
    return code


if __name__ == "__main__":
    sys.exit(main())

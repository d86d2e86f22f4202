"""Run the training image's train.py on PyTorch/XLA's CPU device and record what the XLA path did.

Run by tests/training/test_xla_path.py with the XLA environment's Python (.venv-xla, PJRT_DEVICE=CPU):

    xla_run.py OUT.json -- <train.py flags>

It wraps, without changing them, the XLA calls the training loop makes and writes OUT.json:
  events:    the order of optimizer steps, graph cuts ("sync:<who>": every torch_xla.sync, which xm.mark_step and the
             device loader both call; who is "loader" or the training-image function that asked) and batches
  cuts:      for each sync, in order: who cut and how many graphs the cut launched (0: nothing was pending)
  steps:     for each train_step, PyTorch/XLA's own counts: step markers ("MarkStep") and graphs launched
  compiles:  PyTorch/XLA's own count of graph compilations (debug.metrics "UncachedCompile") after each step
  saves:     for each checkpoint save, the step and the compile count before and after it
  counters:  PyTorch/XLA's counters once the run is over (MarkStep, UncachedCompile, CachedCompile,
             ExecuteComputation), to check that the recorder saw every cut and every compilation
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
TRAINING_IMAGE = HERE.parents[1] / "training_image"
sys.path.insert(0, str(TRAINING_IMAGE))

import torch  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.debug.metrics as met  # noqa: E402
import torch_xla.distributed.parallel_loader as parallel_loader  # noqa: E402

from efa_training.checkpointing import store as checkpoint  # noqa: E402
from efa_training.workloads.gpt import trainer  # noqa: E402

record: dict = {
    **{key: [] for key in ("events", "cuts", "steps", "compiles", "saves", "batches", "losses")},
    "params": {},
    "start_params": {},
}
COUNTERS = ("MarkStep", "UncachedCompile", "CachedCompile", "ExecuteComputation")


def _counters() -> dict[str, int]:
    return {name: int(met.counter_value(name) or 0) for name in COUNTERS}


def _compiles() -> int:
    return _counters()["UncachedCompile"]


def _graphs(counters: dict[str, int]) -> int:
    """Graphs launched. Each launch looks its graph up in the compile cache (Cached- or UncachedCompile) in the
    calling thread; ExecuteComputation is counted later, by the thread that runs the graph, so it is compared only
    once the run is over."""
    return counters["UncachedCompile"] + counters["CachedCompile"]


def _cut_by(frame: Any) -> str:
    """Who cut: the device loader (it syncs before every batch), else the first training-image function past the
    mark_step wrappers (xm.mark_step, distributed.Runtime.mark_step)."""
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path.name == "parallel_loader.py":
            return "loader"
        if TRAINING_IMAGE in path.parents and frame.f_code.co_name != "mark_step":
            return frame.f_code.co_name
        frame = frame.f_back
    return "unknown"


original_sync = torch_xla.sync


def sync(*args, **kwargs):
    # torch_xla.sync, not xm.mark_step: the device loader calls it directly, and xm.mark_step only forwards to it.
    before = _graphs(_counters())
    result = original_sync(*args, **kwargs)
    by = _cut_by(sys._getframe(1))
    record["events"].append(f"sync:{by}")
    record["cuts"].append({"by": by, "graphs": _graphs(_counters()) - before})
    return result


torch_xla.sync = sync

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
    from efa_training.workloads.gpt import data

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
    before = _counters()
    try:
        result = original_train_step(self)
    finally:
        self.optimizer.step = original_step
    _record_step(before, _counters(), result.loss)
    if self.state.step == self.cfg.max_steps:
        record["params"] = _parameters(self.model)
    return result


def _record_step(before: dict[str, int], after: dict[str, int], loss: float) -> None:
    cuts = {"mark_steps": after["MarkStep"] - before["MarkStep"], "graphs": _graphs(after) - _graphs(before)}
    record["steps"].append(cuts)
    record["losses"].append(loss)
    record["compiles"].append(after["UncachedCompile"])
    record["events"].append("step_end")


trainer.Trainer.train_step = train_step  # type: ignore[method-assign]
original_init = trainer.Trainer.__init__


def init(self, *args, **kwargs):
    original_init(self, *args, **kwargs)
    record["start_params"] = _parameters(self.model)
    record["tied"] = self.model.lm_head.weight is self.model.tok_emb.weight


def _parameters(model) -> dict:
    return {name: p.detach().cpu().double().flatten().tolist() for name, p in model.named_parameters()}


trainer.Trainer.__init__ = init  # type: ignore[method-assign]
original_save = checkpoint.CheckpointStore.save


def save(self, model, optimizer, scheduler, train_state, *args, **kwargs):
    # The compile count around each save: a save must not make a graph of its own.
    before = _compiles()
    path = original_save(self, model, optimizer, scheduler, train_state, *args, **kwargs)
    record["saves"].append({"step": train_state.step, "compiles_before": before, "compiles_after": _compiles()})
    return path


checkpoint.CheckpointStore.save = save  # type: ignore[method-assign]


def main() -> int:
    out, rest = Path(sys.argv[1]), sys.argv[2:]
    if rest[:1] == ["--"]:
        rest = rest[1:]
    from efa_training import train

    try:
        code = train.main(rest)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    record["exit_code"] = code
    record["counters"] = _counters()  # after the last save: every graph has run and every cut is counted
    record["torch"] = torch.__version__
    out.write_text(json.dumps(record))
    return code


if __name__ == "__main__":
    sys.exit(main())

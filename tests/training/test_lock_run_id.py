"""The checkpoint folder's lock knows the run on every backend: Batch and EKS pass the run id as --run-id only.

Release 0.10.0 took it from env RUN_ID, which only SageMaker jobs set, so on Batch and EKS the lock recorded
`"run_id": ""` and a retried attempt was refused (exit 5) at once by its own dead predecessor's lock instead of
waiting for FSx to evict that client (docs/training_image.md, "One writer per checkpoint folder"). Here the train
command line each backend builds (the synthesized job definition, test_job_contract.py) is parsed by train.py and
the trainer's own lock call takes the folder, in one process: the predecessor's lock is a second open file of
this process (flock conflicts between open files: test_checkpoint_lock.py), let go after a delay.
"""

import dataclasses
import json
import threading
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from efa_training import train, train_config
from efa_training.checkpointing import lock as checkpoint_lock
from efa_training.runtime.distributed import Runtime
from efa_training.runtime.errors import EXIT_FOLDER_LOCKED, RunRefused
from efa_training.runtime.launch.hyperparameters import as_flags
from efa_training.runtime.launch.stop_by import pop_stop_by
from efa_training.workloads.gpt.trainer import Trainer
from tests.training.test_job_contract import RUN, _batch_commands, _eks_commands

RELEASE_AFTER_S = 2.0  # when the predecessor's lock goes (FSx evicting the dead client)


@pytest.fixture(params=["batch", "eks"])
def cfg(request, synth, monkeypatch, tmp_path):
    """The train job's config as the backend starts it (no RUN_ID: only SageMaker sets it), its folder in tmp."""
    # Batch fills the command's Ref::run_id at submission ("The Ref:: declarations in the command section are used to
    # set placeholders for parameter substitution": https://docs.aws.amazon.com/batch/latest/userguide/example-use-parameters.html)
    for variable in ("FSX_MOUNT", "RUN_ID", "CHECKPOINT_NODE_LOCAL"):
        monkeypatch.delenv(variable, raising=False)
    synthesized = synth(compute=request.param)
    found = _batch_commands(synthesized) if request.param == "batch" else _eks_commands(synthesized, monkeypatch)
    argv, _ = pop_stop_by(found["train"])  # launch.py's own flag, as in test_job_contract
    parsed = train_config.from_args(train.parse_args(as_flags("train", argv)))
    assert parsed.run_id == RUN["run_id"]  # the command line names the run
    return dataclasses.replace(parsed, checkpoint_dir=str(tmp_path))


@pytest.fixture
def rt():
    """A world of one on gloo: take_folder agrees on the outcome with one all-reduce."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=60))
    yield Runtime("cpu", torch.device("cpu"), rank=0, local_rank=0, world_size=1)
    dist.destroy_process_group()


def _take_as_the_trainer(cfg, rt):
    """The trainer's own call: Trainer._open_checkpoints takes the folder's lock before its manager reads a thing."""
    trainer = SimpleNamespace(cfg=cfg, rt=rt, mcfg=cfg.model_config(), model=None, optimizer=None, scheduler=None)
    Trainer._open_checkpoints(trainer)  # type: ignore[arg-type]  # only the fields it reads
    return trainer._lock


def _held_by_an_earlier_attempt(folder, run_id, monkeypatch):
    """The lock as a dead host's attempt holds it until FSx evicts that client: let go after RELEASE_AFTER_S."""
    held = checkpoint_lock.lock_folder(Path(folder), {"host": "dead-node", "run_id": run_id})
    assert not isinstance(held, str)
    released = threading.Event()  # set just before the holder lets go: a lock got later must have waited for it

    def evict() -> None:
        released.set()
        held.close()

    monkeypatch.setenv("CHECKPOINT_LOCK_WAIT_SECONDS", "60")
    monkeypatch.setattr(checkpoint_lock, "LOCK_POLL_SECONDS", 0.1)
    evicted = threading.Timer(RELEASE_AFTER_S, evict)
    evicted.start()
    return released, evicted


def _let_go_now(evicted: threading.Timer) -> None:
    """The refused cases need not wait for the eviction: the predecessor lets go at once."""
    evicted.cancel()
    evicted.function()


def _holder(lock) -> dict:
    with open(lock.name) as f:
        return json.loads(f.read())


def test_the_lock_records_the_run_id_of_the_command_line(cfg, rt):
    assert _holder(_take_as_the_trainer(cfg, rt))["run_id"] == RUN["run_id"]


def test_a_retry_of_the_same_run_waits_for_its_dead_predecessor_then_takes_the_lock(cfg, rt, monkeypatch, capsys):
    released, evicted = _held_by_an_earlier_attempt(cfg.checkpoint_dir, RUN["run_id"], monkeypatch)
    lock = _take_as_the_trainer(cfg, rt)
    evicted.join(timeout=30)
    assert released.is_set() and _holder(lock)["host"] != "dead-node", capsys.readouterr().err


def test_another_run_is_refused_at_once(cfg, rt, monkeypatch):
    released, evicted = _held_by_an_earlier_attempt(cfg.checkpoint_dir, "run-6", monkeypatch)
    started = time.monotonic()
    with pytest.raises(RunRefused, match='holder: .*"run_id": "run-6"') as refused:
        _take_as_the_trainer(cfg, rt)
    assert refused.value.code == EXIT_FOLDER_LOCKED and not released.is_set(), time.monotonic() - started
    _let_go_now(evicted)


@pytest.mark.parametrize("recorded", ["", train_config.UNNAMED_RUN])
def test_a_run_given_no_id_does_not_wait_for_another_such_run(cfg, rt, monkeypatch, recorded):
    # Two hand runs without --run-id or RUN_ID share only the default id: the second is refused at once, whichever
    # of the two the first one's lock recorded.
    released, evicted = _held_by_an_earlier_attempt(cfg.checkpoint_dir, recorded, monkeypatch)
    with pytest.raises(RunRefused):
        _take_as_the_trainer(dataclasses.replace(cfg, run_id=train_config.UNNAMED_RUN), rt)
    assert not released.is_set()
    _let_go_now(evicted)

"""checkpoint_lock.py in one process: one writer per folder (across processes: test_training_guards)."""

from efa_training.checkpointing import lock as checkpoint_lock


def test_second_writer_is_told_who_holds_the_folder(tmp_path):
    first = checkpoint_lock.lock_folder(tmp_path, {"host": "node-a", "pid": 1})
    assert not isinstance(first, str)
    try:
        assert checkpoint_lock.lock_folder(tmp_path, {"host": "node-b"}) == '{"host": "node-a", "pid": 1}'
    finally:
        first.close()

"""The checkpoint library every workload saves and resumes with (it imports only the runtime).

Import the modules themselves; this file imports nothing, so schedule.py stays free of torch.

  format.py    a checkpoint on disk: layout, manifest of sizes and CRC-32s, per-rank verification, RNG state files
  folder.py    rank 0's work on the folder: rename into place, keep-last-N, checkpoints set aside
  lock.py      one writer per checkpoint folder (flock on .writer.lock)
  store.py     CheckpointStore: the atomic save and the agreed resume (torch.save for DDP, DCP for FSDP2)
  schedule.py  when to save (every K steps or the Young/Daly interval, the last step, a stop), without torch
  manager.py   CheckpointManager: the resume, then a save at every step the schedule names
  state.py     TrainerState: step, data position, tokens seen
  reuse.py     a folder whose newest checkpoint another strategy or model wrote is refused before start
"""

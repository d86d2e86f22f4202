"""The training image's code: the platform every workload runs on, the checkpoint library, and the workloads.

  train.py         the `train` entry point: flags -> TrainConfig -> the strategy's workload
  train_config.py  TrainConfig: every `train` setting with its help text, validated; the parser derived from it
  validate.py      the `validate` entry point: the workload's holdout metric against a baseline, the verdict
  prepare_data.py  the `prepare-data` entry point: input files to the format's shards
  runtime/         the platform: launcher, rendezvous, sanity check and EFA proof, exit codes, metrics, storage
  checkpointing/   atomic, verified checkpoints, the folder's writer lock, when to save
  workloads/       what trains: gpt/ (DDP, FSDP2) and ctr_ps/ (parameter servers); __init__.py picks one

Dependencies run one way: workloads import checkpointing and runtime, checkpointing imports runtime, and the runtime
imports no workload. The image runs every entry point as `python -m efa_training...` (runtime/launch/modes.py).
"""

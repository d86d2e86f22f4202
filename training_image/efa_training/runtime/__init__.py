"""The platform every workload gets: what runs the same whichever model trains.

  errors.py        UsageError and RunRefused (one line), the image's exit codes, exit_process
  console.py       log(): one line on stderr
  distributed.py   device and process group (cuda+nccl, cpu+gloo, xla), Runtime
  settings.py      settings dataclasses whose command line is derived from their fields
  run_paths.py     data and checkpoint folders from flags or the pipeline's layout
  storage.py       JSON documents at a path or s3://, files written whole
  preflight.py     what every run refuses before it starts: node count, device, an unwritable folder
  metrics.py       CloudWatch EMF lines; the bf16 peak table for MFU
  host_metrics.py  this host's accelerator utilisation as EMF lines (standalone: also a host service on Batch)
  divergence.py    a non-finite or exploding loss stops the run; diverged.json refuses a repeat
  signals.py       StopFlag: SIGTERM/SIGINT as a request for a final checkpoint
  exit_relay.py    runs an entry point as a torchrun worker and records its exit code for the launcher
  tracking.py      every run an MLflow run, where MLFLOW_TRACKING_URI points; never slows training
  registered_model.py  a model that passed validation, in MLflow's registry
  launch/          the launcher (launch.py MODE): scheduler environment to processes
  sanity/          the sanity check: accelerators, exact collectives, bandwidth, the EFA proof

Nothing here imports a workload, except the launcher's choice of runner (workloads.runner). This file imports
nothing, so the launcher stays free of torch.
"""

"""The sanity check of a node group (`launch.py sanity`, or before training on SageMaker): cli.py's manual says what
it proves and how it exits.

  cli.py          flags, main, the report on stdout and at --report / --report-prefix
  checks.py       the plan, the accelerators, the collectives' results and bandwidth, the group's agreed verdict
  collectives.py  one collective at one message size: exact check, timing, nccl-tests bandwidths
  compute.py      every rank's matmul rate against the group's median: a slow accelerator named before training
  efa_proof.py    EFA devices (uverbs, libfabric's provider) and NCCL's transport, from NCCL's own log
  __main__.py     `python -m efa_training.runtime.sanity`
"""

"""The ctr-ps workload: the parameter-server strategy (`--strategy ps`) for sparse click-through models (model.py).

Roles, all processes of `train.py --strategy ps` (supervisor.py starts them on every training node):
  server g   holds rows r of the embedding tables with r % servers == g in host memory, with their row-wise Adagrad
             state (one accumulator per row, as FBGEMM's rowwise Adagrad), and applies a worker's sparse gradients
             the moment they arrive. Server 0 also holds the dense model (model.CtrModel) and its Adagrad state,
             and every worker's data position: the dense layers train asynchronously on the servers, like the rows.
  worker w   reads its own blocks of the data (criteo.block_indices), pulls the rows its batch touches (and the
             dense weights), computes the loss and its gradients, pushes them without waiting, and goes on.
Messages travel over c10d's TCPStore queues (`queue_push`/`queue_pop`): each server hosts a store; requests go to its
"in" queue, replies to a queue named by the worker and its incarnation, so a replaced worker never reads an answer
meant for the one it replaces. No sockets of our own, and no torch.distributed.rpc: its dynamic membership fails
to admit a process once a member has crashed (measured here: the join waits on the dead member), which is exactly
what a replaced worker must do.

Bounded staleness (stale synchronous parallel, Ho et al. 2013): a server answers worker w's pull only when w's clock
(its next step, plus the offset that sets a replacement level with the others) is at most `staleness` above the
slowest live worker's; 0 is synchronous (every worker waits for the slowest each step), a large bound is
asynchronous. A server reorders nothing: a worker's push is applied before its next pull is answered, so a worker
always reads its own updates.

Checkpoints are consistent cuts: at a save step k every server holds back pushes of step k and later until every
live worker has pushed step k-1, then writes its shard; server 0 writes the dense model, the optimizer state and
every worker's position, then the manifest, and renames the folder into place (the checkpoint library's layout and
checks, format "ps"; cuts.py). A worker that dies (the supervisor tells the servers at once) stops counting for
staleness and saves; its replacement rejoins from its recorded position, at most repeating its last step. A server
that dies restarts every process of the job from the last checkpoint (supervisor.py).

  protocol.py    the messages, the stores and each process's Layout
  server.py      a server: its rows, the staleness bound, pulls and pushes, when to cut
  cuts.py        the server's checkpoints: its part of each cut, server 0 completes it; the resume; --init-from
  worker.py      a worker: its data blocks, pull, forward and backward, push, its metrics line
  supervisor.py  one node's servers and workers as processes: a dead worker replaced, a dead server restarts the job
  nodes.py       the node layout the launcher passes to the supervisor (no torch)
  run.py         the workload's `train`: a role, or pre-flight and the supervisor
  model.py       the DLRM-style model's dense part and its sizes (CTR_SIZES)
  criteo.py      Criteo click logs: parsing, the 157-byte record shards, each worker's blocks
  sample.py      Criteo-format logs with a known answer (tests and the local run)
  prepare_data.py  `prepare-data --format criteo`: logs to record shards
  evaluate.py    validation: tables read from every server's shard, holdout log-loss (the gate) and AUC
"""

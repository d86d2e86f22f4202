"""Pipeline parallelism for the GPT (`--pipeline-parallel N`): the layers cut into N stages, each stage's ranks
sharding it with FSDP2 (and splitting it with tensor parallelism), microbatches passed between stages by PyTorch's own
`torch.distributed.pipelining`.

The mesh is (pp, dp, tp), pp the outer dimension (parallel.device_mesh): a stage is a block of consecutive ranks, so
with 8 ranks a node and tp inside it, stages sit on different nodes and only activations cross EFA between them, the
layout torchtitan and Megatron-LM use. Stage s holds layers [s*L/N, (s+1)*L/N) under their own names (model.py keeps
`blocks` a dict), the first also the embeddings, the last the final norm and the head: the checkpoint of any layout
holds the same keys, so DCP reshards it into any other (2 -> 1, 1 -> 2, with or without tp).

The schedule is 1F1B (Narayanan et al. 2021, PipeDream-Flush): each stage alternates one microbatch's forward with
one's backward once the pipe is full, so it keeps at most N microbatches' activations, not all of them as GPipe does,
and idles (N-1)/(m+N-1) of the step (the bubble). The microbatches are the step's --grad-accum-steps micro-batches,
or, where those are fewer than the stages (1F1B needs as many: torch.distributed.pipelining.Schedule1F1B refuses
fewer), the step's sequences cut into the fewest equal parts that are (sizes.pipeline_microbatches); a step of fewer
sequences than stages runs GPipe. The gradients are scaled by 1/m: the mean over the step, as without a pipeline.

The head shares the token embedding (model.tie_weights), which now lives on two stages: the last stage keeps the
embedding module with the head tied to it, so both stages' parameter is `tok_emb.weight` (in the optimizer's state
too: a checkpoint of one layout has the keys another asks for), and after each backward the two stages add their
gradients (the embedding's and the head's) in one all-reduce between them: both then take the same optimizer step
and stay equal (Megatron-LM's embedding group, Shoeybi et al. 2019). The gradient norm counts that parameter once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from efa_training.workloads.gpt import model as gpt
from efa_training.workloads.gpt.parallel import clip_to_norm, local_grad_norm
from efa_training.workloads.gpt.sizes import pipeline_microbatches


def stage_layers(n_layer: int, stages: int, stage: int) -> range:
    """The layers stage `stage` of `stages` runs: an equal share, in order (the degree divides the layers)."""
    share = n_layer // stages
    return range(stage * share, (stage + 1) * share)


def keep_stage(model: gpt.GPT, stage: int, stages: int) -> gpt.GPT:
    """`model` reduced, in place, to what stage `stage` runs (the module docstring says what each holds)."""
    keep = {str(i) for i in stage_layers(model.cfg.n_layer, stages, stage)}
    for name in [n for n in model.blocks if n not in keep]:
        del model.blocks[name]
    if stage > 0:
        model.pos_emb = None  # no embedding: the stage takes the previous one's activations
    if stage < stages - 1:
        model.ln_f = model.lm_head = None
    if 0 < stage < stages - 1:
        model.tok_emb = None
    return model


@dataclass
class Pipeline:
    """One rank's stage of the pipeline and its schedule, built by `build` once the stage is sharded."""

    schedule: Schedule1F1B | ScheduleGPipe
    stage: int
    stages: int
    pp: dist.ProcessGroup  # this rank's stage peers: the same (dp, tp) place on every stage
    tied: dist.ProcessGroup  # the first and the last stage's ranks at this rank's (dp, tp) place
    model: gpt.GPT

    @property
    def ends(self) -> bool:
        """Whether this rank holds the shared embedding (the first or the last stage)."""
        return self.stage in (0, self.stages - 1)

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Forward and backward of one optimizer step's microbatches (stacked in `inputs`, `targets`): the sum of the
        microbatches' mean losses over their count on the last stage (the loss of the step), 0 elsewhere."""
        losses: list[torch.Tensor] = []
        # return_outputs=False: the last stage would keep and join every microbatch's logits, unused here.
        if self.stage == 0:
            self.schedule.step(inputs, return_outputs=False)
        elif self.stage == self.stages - 1:
            self.schedule.step(target=targets, losses=losses, return_outputs=False)
        else:
            self.schedule.step(return_outputs=False)
        if self.ends:
            self.sync_tied(grads=True)
        if not losses:
            return torch.zeros((), device=inputs.device)
        return torch.stack([x.detach() for x in losses]).mean()

    def sync_tied(self, grads: bool) -> None:
        """The shared embedding made equal on the first and the last stage: the gradients added (after a backward),
        or the first stage's weights copied to the last (at the start: the last stage's own are zeroed, then added)."""
        weight = self.model.tok_emb.weight if self.model.tok_emb is not None else None
        assert weight is not None  # on the first and the last stage
        with torch.no_grad():
            tensor = weight.grad if grads else weight
            if tensor is None:
                return
            local = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # FSDP2: this rank's shard
            if not grads and self.stage != 0:
                local.zero_()
            dist.all_reduce(local, group=self.tied)

    def clip_grad_norm(self, parameters: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
        """The gradient norm of the whole model (every stage's, the shared embedding once), clipped to `max_norm`."""
        shared = self.model.tok_emb.weight if self.model.tok_emb is not None else None
        counted = [p for p in parameters if not (self.stage > 0 and p is shared)]  # the first stage counts it
        squared = local_grad_norm(counted) ** 2
        dist.all_reduce(squared, group=self.pp)
        total = squared.sqrt()
        clip_to_norm(parameters, max_norm, total)
        return total


def build(model: gpt.GPT, mesh: DeviceMesh, micro_steps: int, micro_batch: int, device: torch.device) -> Pipeline:
    """The schedule for this rank's stage (`model`, already reduced by keep_stage and sharded)."""
    stage, stages = mesh["pp"].get_local_rank(), mesh["pp"].size()
    microbatches = pipeline_microbatches(stages, micro_steps, micro_batch)
    piece = PipelineStage(model, stage, stages, device, group=mesh["pp"].get_group())
    kind = Schedule1F1B if microbatches >= stages else ScheduleGPipe
    schedule = kind(piece, n_microbatches=microbatches, loss_fn=gpt.loss, scale_grads=True)
    pipeline = Pipeline(schedule, stage, stages, mesh["pp"].get_group(), _tied_group(mesh), model)
    if pipeline.ends:
        pipeline.sync_tied(grads=False)
    return pipeline


def _tied_group(mesh: DeviceMesh) -> dist.ProcessGroup:
    """A group of two ranks per (dp, tp) place, its first and its last stage's; every rank creates every group
    (new_subgroups_by_enumeration's contract) and gets its own, or a middle stage's none (never used)."""
    grid = mesh.mesh  # (pp, dp, tp) global ranks
    pairs = [[int(grid[0, d, t]), int(grid[-1, d, t])] for d in range(grid.shape[1]) for t in range(grid.shape[2])]
    group, _ = dist.new_subgroups_by_enumeration(pairs)
    return group

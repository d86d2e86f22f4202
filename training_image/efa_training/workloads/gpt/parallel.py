"""Tensor parallelism for the GPT on a device mesh, with FSDP2 on the data-parallel dimension (`--tensor-parallel N`).

The mesh is (pp, dp, tp) (pp: pipeline.py), tp the inner dimension: ranks r..r+N-1 form a tensor-parallel group,
so with N dividing a node's accelerators the group is inside one node (NVLink on GPUs) and FSDP2 shards over dp
across nodes (EFA), the layout torchtitan and Megatron-LM use. In every block the query, key and value projections and
the MLP's first layer are column-parallel (each rank holds 1/N of the heads and of the hidden features) and the
attention's output projection and the MLP's second layer row-parallel (partial sums all-reduced over tp): two
all-reduces over tp per block forward and two backward (Shoeybi et al. 2019, "Megatron-LM", section 3). The
embeddings, the norms and the tied head are not split: replicated over tp, sharded over dp with the rest. Sequence
parallelism on the norms is not applied: it saves their activations (2 of a block's ~34 bytes per token and feature,
Korthikanti et al. 2022, table 2) at the price of the block's inputs redistributed between layouts, and the memory
estimate (sizes.py) counts them unsplit. PyTorch's own APIs throughout: init_device_mesh, parallelize_module,
fully_shard; no hand-written collective.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from efa_training.runtime.distributed import Runtime

# Per block (model.py's names): column-parallel in, row-parallel out, for the attention and for the MLP.
BLOCK_PLAN = {
    "attn.q": ColwiseParallel(),
    "attn.k": ColwiseParallel(),
    "attn.v": ColwiseParallel(),
    "attn.proj": RowwiseParallel(),
    "mlp.0": ColwiseParallel(),
    "mlp.2": RowwiseParallel(),
}


def device_mesh(rt: Runtime, tensor_parallel: int, pipeline_parallel: int = 1) -> DeviceMesh:
    """(pp, dp, tp) over every rank; tp the inner dimension, so a tp group is consecutive ranks: one node's; pp the
    outer, so a pipeline stage is a block of consecutive ranks (pipeline.py). dp and tp are also registered flattened
    ("dp_tp"), which DTensor then uses to reduce a value over both (the gradient norm's full_tensor) in one all-reduce
    with the same result on every rank, not one per dimension (without it, DTensor warns that those may differ between
    ranks; torchtitan flattens its meshes alike)."""
    dp = rt.world_size // (tensor_parallel * pipeline_parallel)
    mesh = init_device_mesh(rt.device_type, (pipeline_parallel, dp, tensor_parallel), mesh_dim_names=("pp", "dp", "tp"))
    mesh["dp", "tp"]._flatten("dp_tp")
    return mesh


def apply_tensor_parallel(blocks: torch.nn.ModuleDict, mesh: DeviceMesh) -> None:
    """Each block's projections split over the mesh's tp dimension (BLOCK_PLAN), in place."""
    for block in blocks.values():
        parallelize_module(block, mesh["tp"], BLOCK_PLAN)


def clip_grad_norm(parameters: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """The global gradient norm, clipped to `max_norm`, over parameters on different meshes (local_grad_norm)."""
    total = local_grad_norm(parameters)
    clip_to_norm(parameters, max_norm, total)
    return total


def local_grad_norm(parameters: list[torch.nn.Parameter]) -> torch.Tensor:
    """The gradient norm of `parameters`, a plain tensor, over parameters on different meshes: the tensor-parallel
    blocks' on (dp, tp), the embeddings' and norms' on dp. torch.nn.utils.clip_grad_norm_ stacks every gradient's norm
    into one tensor, which DTensor refuses across meshes; here each mesh's norm (a DTensor reduced over its mesh) is
    made a plain tensor first, then they are combined, as torchtitan's clip_grad_norm_ does across pipeline stages."""
    by_mesh: dict[object, list[torch.Tensor]] = {}
    for p in parameters:
        if p.grad is not None:
            by_mesh.setdefault(getattr(p.grad, "device_mesh", None), []).append(p.grad)
    norms = []
    for grads in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(grads)
        norms.append(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    return torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())


def clip_to_norm(parameters: list[torch.nn.Parameter], max_norm: float, total: torch.Tensor) -> None:
    """Every gradient scaled so that a total norm of `total` becomes at most `max_norm`, mesh by mesh."""
    by_mesh: dict[object, list[torch.nn.Parameter]] = {}
    for p in parameters:
        if p.grad is not None:
            by_mesh.setdefault(getattr(p.grad, "device_mesh", None), []).append(p)
    for group in by_mesh.values():
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)

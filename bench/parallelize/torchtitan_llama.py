"""torchtitan's own tensor parallel for its Llama 3, as ``sacplan collect --parallelize`` calls it: ``fn(model, tp_mesh)``.

torchtitan 0.3.0's ``parallelize_llama`` (its train spec's ``parallelize_fn``) applies, in order, tensor
parallel (``model.parallelize(parallel_dims)``: every module's ``sharding_config``, set from its config by
``update_from_config``), activation checkpointing, compile and ``fully_shard``. ``parallelize`` here runs its
tensor-parallel step, through a torchtitan ``ParallelDims`` whose ``tp`` mesh is sacplan's (so that
``fully_shard`` over sacplan's FSDP dimension later shares the mesh's root); sacplan then applies the plan and
``fully_shard`` itself (``--fsdp-world-size D --mixed-precision bf16``: torchtitan's defaults). The backend is
torchtitan's ``partial_dtensor`` (DTensor for the model-parallel axes); its default ``spmd_types`` backend is not
tried here. Calling ``parallelize_llama`` whole is not done: it applies ``fully_shard`` itself (sacplan's FSDP2
accounting would not know its units), and on a machine without an accelerator torchtitan's own meshes are CUDA
meshes (see docs/tensor-parallel.md, "torchtitan's way").
"""

from __future__ import annotations

import torch.distributed as dist

__all__ = ["parallelize", "tt_parallel_dims"]


def tt_parallel_dims(tp_mesh):
    """torchtitan's ``ParallelDims`` of the job sacplan collects (FSDP degree x ``tp_mesh``), its ``tp`` mesh being
    ``tp_mesh`` itself."""
    from torchtitan.distributed import ParallelDims

    world = dist.get_world_size()
    tp = tp_mesh.size()
    dims = ParallelDims(dp_replicate=1, dp_shard=world // tp, cp=1, tp=tp, pp=1, ep=1, world_size=world,
                        spmd_backend="partial_dtensor")
    dims._single_axis_meshes["tp"] = tp_mesh  # torchtitan's mesh cache: the TP axis is sacplan's
    return dims


def parallelize(model, tp_mesh):
    """torchtitan's tensor-parallel step of ``parallelize_llama``, over ``tp_mesh``."""
    model.parallelize(tt_parallel_dims(tp_mesh))


"""torchtitan's own tensor parallel for its Llama 3, as ``sacplan collect --parallelize`` calls it: ``fn(model, tp_mesh)``.

torchtitan 0.3.0's ``parallelize_llama`` (its train spec's ``parallelize_fn``) applies, in order, tensor
parallel (``model.parallelize(parallel_dims)``: every module's ``sharding_config``, set from its config by
``update_from_config``), activation checkpointing, compile and ``fully_shard``. ``parallelize`` here runs its
tensor-parallel step, through a torchtitan ``ParallelDims`` whose ``tp`` mesh is sacplan's (so that
``fully_shard`` over sacplan's FSDP dimension later shares the mesh's root); sacplan then applies the plan and
``fully_shard`` itself (``--fsdp-world-size D --mixed-precision bf16``: torchtitan's defaults). The backend is
torchtitan's ``partial_dtensor`` (DTensor for the model-parallel axes); its default ``spmd_types`` backend is not
tried here. ``parallelize_llama_whole`` calls ``parallelize_llama`` itself (no AC, no compile); it also applies
``fully_shard`` (over a degree-1 mesh with TP alone), which sacplan's collection does not expect: see
docs/tensor-parallel.md, "torchtitan's way".
"""

from __future__ import annotations

import torch.distributed as dist

__all__ = ["parallelize", "parallelize_llama_whole", "tt_parallel_dims"]


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


def parallelize_llama_whole(model, tp_mesh):
    """torchtitan's ``parallelize_llama`` itself, TP only (no AC, no compile; it also wraps the model in
    ``fully_shard`` over a degree-1 data-parallel mesh, for its mixed precision)."""
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.models.llama3 import parallelize_llama

    dims = tt_parallel_dims(tp_mesh)
    if dims.dp_shard != 1:
        raise ValueError("parallelize_llama_whole: TP alone (no --fsdp-world-size); torchtitan's fully_shard and "
                         "sacplan's would both shard the model")
    dims.build_mesh()
    dims._single_axis_meshes["tp"] = tp_mesh
    parallelism = ParallelismConfig(tensor_parallel_degree=tp_mesh.size(), spmd_backend="partial_dtensor")
    parallelize_llama(model, parallel_dims=dims, training=TrainingConfig(), parallelism=parallelism,
                      compile_config=CompileConfig(enable=False), ac_config=None, dump_folder="/tmp")

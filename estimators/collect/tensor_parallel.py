"""Collecting one rank of a tensor-parallel job (FSDP2 over it or not) under PyTorch's fake process group.

The copied model (fake tensors) is parallelized over the job's (FSDP x TP)
mesh in torchtitan's order: tensor parallel first
(:func:`estimators.common.parallelize_tp`: the user's function or the HF
plan), then ``fully_shard``. What the rank computes on is its DTensors'
local shards, so the collector books and prices those (``local_shards``).
TP's collectives in a module's forward (the parallel styles' all-reduces and
all-gathers and their waits) are ops of the module, marked ``must_save``:
recomputing one would communicate again (``planner.MUST_SAVE_OPS``). FSDP2's
own collectives stay communication, as in :mod:`estimators.collect.fsdp`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import nn

from estimators.collect.fsdp import meta_copy
from estimators.common import (FsdpSetup, ParallelDims, default_units, module_fqns, op_name, parallelize_tp,
                               shard_model, unit_fqns)

_WAIT = torch.ops._c10d_functional.wait_tensor.default

__all__ = ["is_seeded_op", "job_parallelism", "parallelize_step", "step_copy", "stats_op_name"]


def is_seeded_op(func: Any) -> bool:
    """Whether AOTAutograd's partitioner takes the op for a random one (``nondeterministic_seeded``), whatever
    its arguments: CPU attention's kernel with ``dropout_p`` 0 included.

    In a compiled TP step such ops count as random (saved, never recomputed): a checkpointed region that
    recomputes one gets its RNG state threaded from forward to backward by the partitioner
    (``functionalize_rng_ops``), which appends that state among the forward's outputs after the saved opaque
    objects; a TP region saves its DeviceMesh (an opaque object) for the backward, and AOTAutograd's runtime
    then finds the mesh among the saved tensors (torch 2.13: ``AssertionError: expected all
    tensors_saved_with_vc_check to be Tensors``). Saved, the op is not recomputed and no RNG state is threaded.
    """
    return torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())


def stats_op_name(func: Any, compiled: bool) -> str:
    """The op's name in the stats: the name the SAC policy sees for the op in its place, in an eager run or
    (``compiled``) in the AOTAutograd trace of a compiled one.

    A functional collective's result is wrapped for a later wait: eagerly
    ``_c10d_functional._wrap_tensor_autograd`` (an AsyncCollectiveTensor,
    waited where first used), but under fake tensors (taken for tracing,
    ``torch.distributed._functional_collectives._are_we_tracing``)
    ``_c10d_functional.wait_tensor`` at once. The collector runs the wait as
    eager's kernel does (its input returned) and names it as eager does; for a
    compiled step it keeps the traced name, ``wait_tensor``, which is what the
    policy sees when AOTAutograd traces the graph (the wait follows its
    collective at once there too).
    """
    if func is _WAIT and not compiled:
        return "_c10d_functional._wrap_tensor_autograd"
    return op_name(func)


def job_parallelism(fsdp: FsdpSetup | None, parallel: ParallelDims | None,
                    compile_backend: str | None) -> tuple[ParallelDims | None, FsdpSetup | None]:
    """The one description of the collected job's parallelism (and its FSDP2 part) from ``collect_stats``'
    arguments; ValueError for arguments that contradict each other."""
    if parallel is None:
        return (None if fsdp is None else ParallelDims(fsdp=fsdp)), fsdp
    if parallel.pp is not None:
        raise ValueError(f"parallel.pp {parallel.pp}: a pipeline is collected stage by stage "
                         f"(run_pipeline_collection, sacplan collect --pp-stages), not in one step")
    if fsdp is not None and fsdp != parallel.fsdp:
        raise ValueError("give fsdp or parallel (whose fsdp is the FSDP2 setup), not both")
    if compile_backend is not None and parallel.tp_enabled and parallel.fsdp is not None:
        raise ValueError(f"compile_backend {compile_backend!r} with fsdp over tensor parallel: a compiled FSDP2 step "
                         f"is not collected yet (a compiled TP step alone is); collect without one of them")
    if compile_backend not in (None, "aot_eager") and parallel.tp_enabled:
        raise ValueError(f"compile_backend {compile_backend!r} with tensor parallel: a compiled TP step is collected "
                         f"under 'aot_eager' only (inductor's kernels allocate outside the dispatcher, so no real "
                         f"TP step under it has been measured against a prediction)")
    return parallel, parallel.fsdp


def step_copy(model: nn.Module, parallel: ParallelDims | None) -> tuple[nn.Module, dict[nn.Module, str], list[str]]:
    """(the model the step runs, its modules' fqns, the FSDP units): a parallel step runs on a copy (on meta, to be
    made fake and parallelized) whose fqns are the model's own; else the model itself."""
    fqns = module_fqns(model)
    if parallel is None:
        return model, fqns, []
    fsdp = parallel.fsdp
    units = [] if fsdp is None else unit_fqns(model, fsdp.wrap if fsdp.wrap is not None else default_units(model), fqns)
    step_model = meta_copy(model)
    return step_model, module_fqns(step_model, root=type(model).__name__), units


def parallelize_step(model: nn.Module, dims: ParallelDims, mesh: Any, units: list[str],
                     fqns: dict[nn.Module, str], fake: Any) -> str | None:
    """TP over ``mesh``'s ``tp`` dimension, then ``fully_shard`` of ``units`` over its FSDP dimension (the whole
    mesh when it is 1-D), under the step's FakeTensorMode ``fake``; returns the TP plan applied (or None)."""
    # sub-meshes sliced outside FakeTensorMode (their rank tensors are real)
    tp_mesh, fsdp_mesh = (mesh["tp"], mesh["dp_shard"]) if dims.tp_enabled else (None, mesh)
    plan = None
    with fake:
        if dims.tp_enabled:
            plan = parallelize_tp(model, tp_mesh, parallelize=dims.parallelize,
                                  sequence_parallel=dims.sequence_parallel)
        if dims.fsdp is not None:
            with _meshes_joined_for_real() if dims.tp_enabled else nullcontext():
                shard_model(model, dims.fsdp, fsdp_mesh, units, fqns)
    return plan


@contextmanager
def _meshes_joined_for_real() -> Iterator[None]:
    """While ``fully_shard`` runs over TP's DTensors under the FakeTensorMode: FSDP2 joins its mesh and TP's
    (``DeviceMesh._concatenate``), computing on the meshes' real rank tensors, which fake tensor mode refuses
    (or cannot follow: ``nonzero``); the join runs outside fake mode, as the meshes themselves were made."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    joined = DeviceMesh._concatenate  # layout: allow-private (FSDP2's own call, wrapped, not replaced)

    def outside_fake(meshes: list[Any]) -> Any:
        with unset_fake_temporarily():
            return joined(meshes)

    DeviceMesh._concatenate = staticmethod(outside_fake)
    try:
        yield
    finally:
        DeviceMesh._concatenate = staticmethod(joined)


"""FSDP2's collectives on gloo (CPU ranks), made to let go of their buffers before FSDP2 goes on.

gloo runs each collective on a worker thread of its own. The work object
that thread runs holds the collective's tensors (an all-gather's flat output
buffer, a reduce-scatter's input and output) and the thread drops it only
after marking it complete, so after ``work.wait()`` the buffers may stay
allocated for a while, until that thread is scheduled again: FSDP2 has
dropped its all-gather buffer and already allocates the next unit's, and the
rank holds one buffer more than FSDP2's program order says, now and then
(seen: +147,968 bytes, one tiny llama decoder layer's gathered parameters;
+49,664 bytes at the step's peak when the extra buffer overlapped another
moment). The per-rank stats model program order, so a real gloo rank is made
to follow it: the collectives here wait until gloo's thread no longer
references the buffers FSDP2 passed (the reference counts of their storages
and of the tensors passed, C++ and Python, are back to what they were before
the call: see ``_counts`` for why the Python count), then return. Deterministic, and it
adds no memory (the buffers are FSDP2's own, allocated as by default).

Tensor parallel's collectives (the functional ones DTensor's redistributions
issue: all-reduce, all-gather, reduce-scatter) hit the same race on gloo (seen:
+1.5 MiB on one rank's step 3 in 1 of 4 runs, the LM head's all-gather input
and output still held by gloo's thread): :class:`SettledFunctionalCollectives`
runs them as the same c10d collectives, settled, while a real TP step runs.

Only for gloo: NCCL's buffers live in the CUDA caching allocator, whose reuse
follows stream events, not these references (docs/fsdp.md).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["SettledAllGather", "SettledFunctionalCollectives", "SettledReduceScatter", "run_settled",
           "settle_gloo_collectives", "SETTLE_TIMEOUT_S"]

SETTLE_TIMEOUT_S = 60.0  # gloo's thread lets go within milliseconds; this only guards a hang


def _use_count(st: torch.UntypedStorage) -> int:
    return torch._C._storage_Use_Count(st._cdata)  # layout: allow-private (no public reference count of a storage)


def _counts(tensors: tuple[torch.Tensor, ...], storages: dict[int, torch.UntypedStorage]) -> list[int]:
    """What may hold the collective's buffers: the C++ references to the tensors passed (gloo's work may hold
    them, their TensorImpl, or views of them, their storage) and the Python references to those tensors.

    The Python count matters because a tensor with a Python object is kept alive by it: a C++ reference that
    takes the TensorImpl's count from 1 to 2 increfs that object, and dropping it back to 1 decrefs it, in that
    order (c10/util/intrusive_ptr.h, "PyObject preservation"). On gloo's worker thread the C++ count comes
    back first and the decref waits for the GIL, so between the two the C++ counts are settled while the
    Python object still carries gloo's reference: a caller that drops the tensor then does not free it; gloo's
    thread does, later (seen: 1 reduce-scatter in about 500 on 2 CPU ranks, the input not freed at once)."""
    held = [t._use_count() for t in tensors]  # layout: allow-private (no public reference count of a tensor)
    python_refs = [sys.getrefcount(t) for t in tensors]
    return held + [_use_count(st) for st in storages.values()] + python_refs


def _held(tensors: tuple[torch.Tensor, ...], now: list[int], before: list[int]) -> str:
    n = len(tensors)
    kinds = [f"tensor {i} ({tuple(t.shape)}, C++ references)" for i, t in enumerate(tensors)]
    kinds += [f"storage {i} (C++ references)" for i in range(len(now) - 2 * n)]
    kinds += [f"tensor {i} ({tuple(t.shape)}, Python references)" for i, t in enumerate(tensors)]
    return ", ".join(f"{k}: {b} before, {c} now" for k, c, b in zip(kinds, now, before) if c > b)


def run_settled(tensors: tuple[torch.Tensor, ...], issue: Callable[[], Any], *,
                timeout_s: float = SETTLE_TIMEOUT_S) -> None:
    """Run ``issue()`` (an async collective on ``tensors``, returning its work), wait for it, then until the
    backend lets go of ``tensors``.

    Lets go: every count :func:`_counts` reads is back to at most what it was before the call, so a buffer
    the caller drops after this returns is freed there and then. Raises ``RuntimeError`` naming what is still
    held if that does not happen within ``timeout_s`` seconds."""
    storages: dict[int, torch.UntypedStorage] = {}
    for t in tensors:
        st = t.untyped_storage()
        storages.setdefault(st._cdata, st)  # layout: allow-private (a storage's only identity)
    before = _counts(tensors, storages)
    work = issue()
    work.wait()
    del work
    deadline = time.monotonic() + timeout_s
    while True:
        now = _counts(tensors, storages)
        if all(c <= b for c, b in zip(now, before)):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the process group still holds a collective's buffers {timeout_s} s "
                               f"after the collective completed: {_held(tensors, now, before)}")
        # let gloo's worker thread run: it drops the work without the GIL, but needs the GIL for the decref
        time.sleep(0)


# FSDP2's comm interfaces (what set_custom_all_gather/set_custom_reduce_scatter take) are not re-exported publicly
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _AllGatherBase  # noqa: E402
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _ReduceScatterBase  # noqa: E402


class SettledAllGather(_AllGatherBase):
    """FSDP2's default all-gather (buffer from ``torch.empty``), returning once gloo has let go of it."""

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 async_op: bool = False) -> None:
        run_settled((output_tensor, input_tensor),
                    lambda: dist.all_gather_single(output_tensor, input_tensor, group=group, async_op=True))
        return None


class SettledReduceScatter(_ReduceScatterBase):
    """FSDP2's reduce-scatter as an in-place all-reduce of its input and a copy of this rank's chunk, returning
    once gloo has let go of the input."""

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op: Any, async_op: bool = False) -> None:
        # gloo's reduce-scatter reduces a copy of its input that its work holds (out of FSDP2's reach); an
        # all-reduce in place on FSDP2's own input buffer (a temporary it frees after) needs no copy, then this
        # rank's chunk is the reduce-scatter's output: the same sums, no buffer FSDP2 does not know of.
        run_settled((input_tensor,), lambda: dist.all_reduce(input_tensor, op=op, group=group, async_op=True))
        chunk = input_tensor.view(dist.get_world_size(group), -1)[dist.get_rank(group)]
        output_tensor.view(-1).copy_(chunk)
        return None


def settle_gloo_collectives(model: nn.Module) -> int:
    """Give every ``fully_shard``-ed module of ``model`` whose process group is gloo the settled collectives.

    Call it after ``fully_shard`` on a CPU (gloo) rank; returns how many
    modules got them (0 on any other backend, the fake one included; 1-D
    meshes only, as ``shard_model`` makes).
    """
    from torch.distributed.fsdp import FSDPModule

    n = 0
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        mesh = _mesh(module)
        if mesh is not None and mesh.ndim == 1 and dist.get_backend(mesh.get_group()) == "gloo":
            module.set_custom_all_gather(SettledAllGather())
            module.set_custom_reduce_scatter(SettledReduceScatter())
            n += 1
    return n


def _mesh(module: nn.Module) -> Any:
    """The device mesh of a sharded module's parameters (one mesh per ``fully_shard`` call here)."""
    from torch.distributed.tensor import DTensor

    return next((p.device_mesh for p in module.parameters() if isinstance(p, DTensor)), None)


_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
               "product": dist.ReduceOp.PRODUCT, "avg": dist.ReduceOp.SUM}  # avg: the sum divided after


class SettledFunctionalCollectives(TorchDispatchMode):
    """While a real tensor-parallel step runs on gloo: the functional all-reduce, all-gather and reduce-scatter
    (``torch.ops._c10d_functional``) run as c10d collectives on the same group that return once gloo has let go
    of their buffers; their outputs are what the functional ops return (a new tensor each), complete, so the
    waits that follow have nothing to wait for. Any other op runs as it is.

    A compiled model runs compiled under it (as under ``measure_steps``' tracker): dynamo runs a frame eagerly
    while a dispatch mode that does not ignore compile internals is active. The compiled graph's collectives
    then reach it at run time (``aot_eager``: its graph calls the functional ops, each followed by a
    ``wait_tensor`` of a tensor no work is registered for, which returns it as it is)."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ops = torch.ops._c10d_functional
        if func is ops.all_reduce.default:
            inp, reduce_op, group_name = args
            out = inp.clone()
            self._reduce(out, reduce_op, _group(group_name))
            return out
        if func is ops.all_gather_into_tensor.default:
            inp, group_size, group_name = args
            inp = inp.contiguous()
            out = inp.new_empty((group_size * inp.shape[0], *inp.shape[1:]))
            run_settled((out, inp), lambda: dist.all_gather_single(out, inp, group=_group(group_name),
                                                                   async_op=True))
            return out
        if func is ops.reduce_scatter_tensor.default:
            inp, reduce_op, group_size, group_name = args
            group = _group(group_name)
            full = inp.contiguous().clone()  # as gloo's own reduce-scatter copies its input
            self._reduce(full, reduce_op, group)
            return full.view(group_size, -1)[dist.get_rank(group)].clone().view(inp.shape[0] // group_size,
                                                                                  *inp.shape[1:])
        return func(*args, **kwargs)

    @staticmethod
    def _reduce(t: torch.Tensor, reduce_op: str, group: dist.ProcessGroup) -> None:
        run_settled((t,), lambda: dist.all_reduce(t, op=_REDUCE_OPS[reduce_op], group=group, async_op=True))
        if reduce_op == "avg":
            t.div_(dist.get_world_size(group))


def _group(group_name: str) -> dist.ProcessGroup:
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(group_name)  # layout: allow-private (a functional collective's group by name)

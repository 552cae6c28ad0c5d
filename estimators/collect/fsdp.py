"""Collecting one rank of an FSDP2 job: ``fully_shard`` under PyTorch's fake process group.

A single process runs the fake step of one rank of an N-rank FSDP2 job: the
process group is PyTorch's ``"fake"`` backend (collectives return at once and
move nothing), the model is a copy on fake tensors with ``fully_shard``
applied to its units and its root, so what the step allocates is one rank's:
sharded parameters, gradients and optimizer state, the all-gathered
parameters of the unit running (and of the one prefetched in backward), the
all-gather and reduce-scatter buffers and mixed-precision copies.

Two things the storage book must be told about (see :class:`ShardedStep`):

* FSDP2 frees and re-allocates unsharded parameters by resizing their
  storages (``untyped_storage().resize_(0)`` after a unit's forward,
  ``resize_(n)`` before it runs again); a resize is no new storage, so the
  book follows ``UntypedStorage.resize_`` while the step runs;
* what FSDP2 runs around a unit's forward (its pre- and post-forward hooks:
  the parameters' copy-in and mixed-precision casts, the all-gather, the
  copy-out into the unsharded parameters, resharding) is communication, not
  the module's computation: a checkpoint of the module never recomputes it
  (FSDP2's own backward hook gathers the parameters before any recompute).
  The rule: an op run inside those hooks or of a collective namespace
  (``c10d``, ``_c10d_functional``, ``fsdp``: all-gather, reduce-scatter and
  FSDP2's copy ops) is never in a module's op list nor its forward time, and
  the storages it makes are booked as ``fsdp`` (collective buffers and
  gathered parameters), not activations.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from planner import Sharding
from estimators.common import ACT, COMM, GRAD, TEMP, StorageBook, follow_storage_resizes, storages_of

__all__ = ["record_sharding", "ShardedStep", "fake_process_group", "is_collective_op", "meta_copy", "run_collective",
           "run_op"]

_COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional", "fsdp"})


def run_op(func: Any, args: tuple, kwargs: dict) -> Any:
    """``func(*args, **kwargs)``, but a functional collective's wait returns its input, as its eager kernel does
    (fake tensor mode makes a new tensor: the rank would seem to hold every collective's output twice)."""
    if func is torch.ops._c10d_functional.wait_tensor.default:
        return args[0]
    return func(*args, **kwargs)


def run_collective(book: StorageBook, func: Any, args: tuple, kwargs: dict) -> Any:
    """Run one of FSDP2's collectives under the collector: booked as communication, no module's op, no compute
    time (moved out of the collector's dispatch mode)."""
    out = run_op(func, args, kwargs)
    for st in storages_of(out):
        book.add(st, COMM)
    if "reduce_scatter" in func.__name__ and args:  # its output holds the unit's sharded gradients
        for st in storages_of(args[0]):
            book.recategorize(st, GRAD)
    for st in storages_of(kwargs.get("out")):  # FSDP2's copy-in/copy-out buffers
        if book.category(st) in (ACT, TEMP):
            book.recategorize(st, COMM)
    return out


def is_collective_op(func: Any) -> bool:
    """An op of a collective namespace: all-gather, reduce-scatter, FSDP2's copy-in/copy-out (never recomputed)."""
    return getattr(func, "namespace", None) in _COLLECTIVE_NAMESPACES


def meta_copy(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` with its parameters and buffers on ``meta``: the original is never touched."""
    memo: dict[int, Any] = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    return copy.deepcopy(model, memo)


@contextmanager
def fake_process_group(world_size: int, device_type: str, dims: Any = None) -> Iterator[Any]:
    """PyTorch's fake process group of ``world_size`` ranks (this process is rank 0); yields its device mesh.

    ``dims`` (a ``ParallelDims``) with tensor parallel: its 2-D mesh (FSDP x
    TP, ``world_size`` its ranks); else a 1-D mesh of ``world_size`` ranks.

    The mesh is made here, outside any FakeTensorMode (made inside, its
    ``aten._local_scalar_dense`` fails on fake tensors); the group is
    destroyed on exit, so collections can follow one another in a process.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialized in this process: collect with "
                           "--fsdp-world-size in a process of its own (not inside a distributed job)")
    dist.init_process_group(backend="fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        tp = dims is not None and dims.tp_enabled
        yield dims.make_mesh(device_type) if tp else init_device_mesh(device_type, (world_size,))
    finally:
        dist.destroy_process_group()


class ShardedStep:
    """While the fake step runs: the book follows storage resizes, and FSDP2's hooks open an ``fsdp`` window.

    ``busy`` is true while FSDP2 runs a unit's pre- or post-forward hook (the
    collector books what is made then as :data:`COMM` and records no op).
    """

    def __init__(self, book: StorageBook, units: Sequence[nn.Module]):
        self.book, self.units = book, list(units)
        self.depth = 0
        self._handles: list[Any] = []
        self._resize: Any = None

    @property
    def busy(self) -> bool:
        return self.depth > 0

    def _enter(self, *_: Any, **__: Any) -> None:
        self.depth += 1

    def _leave(self, *_: Any, **__: Any) -> None:
        self.depth = max(0, self.depth - 1)

    def __enter__(self) -> ShardedStep:
        for mod in self.units:  # ours first and last around FSDP2's own hooks (it prepends its pre-hook)
            self._handles += [
                mod.register_forward_pre_hook(self._enter, prepend=True),
                mod.register_forward_pre_hook(self._leave),
                mod.register_forward_hook(self._enter, prepend=True),
                mod.register_forward_hook(self._leave, always_call=True),
            ]
        self._resize = follow_storage_resizes(self.book, lambda: COMM)
        self._resize.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._resize.__exit__(*exc)
        for h in self._handles:
            h.remove()

    def book_grads(self, params: Sequence[nn.Parameter]) -> None:
        """After backward: the sharded gradients FSDP2 assigned are gradients (a cast copy included)."""
        self.book.recategorize_all(storages_of([p.grad for p in params if p.grad is not None]), GRAD)


def record_sharding(stats: Any, fsdp: Any, units: Sequence[str], dims: Any = None, tp_plan: str | None = None) -> None:
    """The stats' ``metadata.sharding`` of one rank collected with ``fsdp`` (an ``FsdpSetup`` or None) over
    ``units``, and ``dims``' tensor parallel (a ``ParallelDims``) with the plan ``tp_plan`` applied."""
    kept = {m.fqn for m in stats.modules}  # a unit run out of place is not in the stats (nor planned)
    tp = {}
    if dims is not None and dims.tp_enabled:
        tp = {"tp_size": dims.tp_size, "tp_plan": tp_plan, "sequence_parallel": dims.sequence_parallel or None}
    if fsdp is None:  # tensor parallel alone: nothing sharded by fully_shard
        stats.metadata.sharding = Sharding(kind="tp", world_size=1, units=[stats.modules[0].fqn], **tp)
        return
    stats.metadata.sharding = Sharding(kind="fsdp2", world_size=fsdp.world_size, units=[u for u in units if u in kept],
                                       mixed_precision=fsdp.mixed_precision,
                                       reshard_after_forward=fsdp.reshard_after_forward,
                                       sync_every_micro_batch=None if fsdp.sync_every_micro_batch else False, **tp)

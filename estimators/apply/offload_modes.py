"""A selective-checkpoint context pair of our own: each op output is saved, recomputed or offloaded.

torch 2.13's eager selective checkpointing treats ``MUST_CPU_OFFLOAD`` as
recompute (its caching mode keeps an output only for the save policies), and
its saved outputs never reach a saved-tensor hook, so an offload inside a
checkpointed module has to be the cache's own doing. This pair keeps torch's
cache semantics (one FIFO per op overload, filled in the forward, emptied in
the recomputation, the ops ``SAC_IGNORED_OPS`` names passed through, saved
outputs kept as detached aliases), so a plan that only saves and recomputes
holds exactly the bytes torch's pair holds; and for an op the policy tags
``MUST_CPU_OFFLOAD`` (or ``PREFER_CPU_OFFLOAD``) it keeps the output like a
saved one until the region's forward ends, then hands it to the
:class:`estimators.apply.offload.HostStore` (copied after every write the
region makes to it) and keeps only the handle. The recomputation returns the
fetched device copy. An early-stopped recomputation lets go of the offloaded
entries it did not reach (saved ones stay, as torch leaves them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext

from estimators.apply.offload import Handle, HostStore
from estimators.apply.policy import PlanMismatchError
from estimators.common import SAC_IGNORED_OPS, is_view_op, op_name

__all__ = ["offload_contexts"]

_SAVE = (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE)
_OFFLOAD = (CheckpointPolicy.MUST_CPU_OFFLOAD, CheckpointPolicy.PREFER_CPU_OFFLOAD)
_RECOMPUTE, _CONSUMED = object(), object()


@dataclass(eq=False)
class _Offloaded:
    """A cache entry the store holds: the outputs until the region's forward ends, then their handles."""

    value: Any
    label: str
    view: bool


@dataclass(frozen=True)
class _Alias:
    """One cache entry's tensor over an offloaded storage: the handle and the tensor's own geometry (an op and the
    in-place ops or ``_unsafe_view`` after it share one storage, one host copy, with shapes of their own)."""

    handle: Handle
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    def on(self, dev: torch.Tensor) -> torch.Tensor:
        """This entry's tensor over the fetched storage."""
        if (tuple(dev.shape), dev.stride(), dev.storage_offset()) == (self.shape, self.stride, self.offset):
            return _detached(dev)
        return _detached(dev.as_strided(self.shape, self.stride, self.offset))


def _detached(x: Any) -> Any:
    """An alias without autograd history that still shares the version counter of a view's base, as the cache
    of torch's pair keeps it (detach with the ADInplaceOrView key included)."""
    if not isinstance(x, torch.Tensor):
        return x
    keys = torch._C.DispatchKey  # layout: allow-private (torch has no public guard for this dispatch key)
    with torch._C._SetExcludeDispatchKeyGuard(keys.ADInplaceOrView, False):  # layout: allow-private (as above)
        return x.detach()


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class _Forward(TorchDispatchMode):
    """The forward: run each op, ask the policy, keep what it says."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __init__(self, policy: Any, cache: dict, store: HostStore, fqn: str, module: nn.Module,
                 per_call: bool = False):
        super().__init__()
        self.policy, self.cache, self.store, self.fqn, self.module = policy, cache, store, fqn, module
        self.per_call = per_call  # a module called more than once: this call's offloads leave when it ends
        self.handles: list[Handle] = []
        self.count = 0
        self.owned: set[int] = set()

    def __enter__(self) -> Any:
        self.count = 0
        self.owned = {_storage_key(t) for t in (*self.module.parameters(), *self.module.buffers())
                      if t.layout == torch.strided and not is_traceable_wrapper_subclass(t)}
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SAC_IGNORED_OPS:
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        k = self.count
        self.count += 1
        policy = self.policy(SelectiveCheckpointContext(is_recompute=False, op_output=out), func, *args, **kwargs)
        if isinstance(policy, bool):
            policy = CheckpointPolicy.MUST_SAVE if policy else CheckpointPolicy.PREFER_RECOMPUTE
        slot = self.cache.setdefault(func, [])
        if policy in _SAVE:
            slot.append(tree_map(_detached, out))
        elif policy in _OFFLOAD:
            slot.append(_Offloaded(tree_map(_detached, out), f"module {self.fqn!r}: op {k} ({op_name(func)})",
                                   is_view_op(func)))
        else:
            slot.append(_RECOMPUTE)
        return out

    def __exit__(self, *exc: Any) -> Any:
        out = super().__exit__(*exc)  # off the mode stack first: the copies are not ops of the region
        if exc[0] is None:
            self._offload_entries()  # (its locals gone: a drop checks that nothing else holds the storages)
            if self.per_call:
                handles, self.handles = self.handles, []
                self.store.drop_call(list({id(h): h for h in handles}.values()))
        return out

    def _check(self, e: _Offloaded, t: torch.Tensor) -> None:
        why = None
        if e.view:
            why = "it is a view (views are recomputed: offload the op that made its base)"
        elif is_traceable_wrapper_subclass(t) or t.layout != torch.strided:
            why = f"it is a {type(t).__name__} with layout {t.layout} (only plain dense tensors are offloaded)"
        elif _storage_key(t) in self.owned:
            why = "it shares its storage with a parameter or buffer of the module (nothing would be freed)"
        elif (t.storage_offset() != 0 or not _dense(t)
              or t.untyped_storage().nbytes() != t.numel() * t.element_size()):
            why = (f"its storage ({t.untyped_storage().nbytes()} bytes) is not exactly the tensor's "
                   f"({t.numel() * t.element_size()} bytes, offset {t.storage_offset()}): the bytes freed would "
                   f"not be the bytes copied")
        if why is not None:
            raise PlanMismatchError(f"{e.label} cannot be offloaded: {why}; the plan must save or recompute it")

    def _offload_entries(self) -> None:
        offloaded: set[int] = set()
        for slot in self.cache.values():
            for e in slot:
                if isinstance(e, _Offloaded):
                    for t in tree_leaves(e.value):
                        if isinstance(t, torch.Tensor):
                            self._check(e, t)
                    e.value = tree_map(lambda x, e=e: self._to_store(x, e.label, offloaded), e.value)
        if not offloaded:
            return
        for slot in self.cache.values():  # a saved output over an offloaded storage (an in-place op's) goes too
            for i, e in enumerate(slot):
                if isinstance(e, torch.Tensor) and _storage_key(e) in offloaded:
                    slot[i] = _Offloaded(self._to_store(e, "(a saved alias)", offloaded), "(a saved alias)", False)

    def _to_store(self, x: Any, label: str, offloaded: set[int]) -> Any:
        if not isinstance(x, torch.Tensor) or x.untyped_storage().nbytes() == 0:
            return x  # an empty tensor frees nothing (and has no address to tell it apart): kept as saved
        offloaded.add(_storage_key(x))
        h = self.store.offload(x, label, self.per_call)
        if self.per_call:
            self.handles.append(h)
        return _Alias(h, tuple(x.shape), x.stride(), x.storage_offset())


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill a block of memory without gaps or overlaps (any order of dimensions)."""
    expected = 1
    for size, stride in sorted((d for d in zip(t.shape, t.stride()) if d[0] != 1), key=lambda d: d[1]):
        if stride != expected:
            return False
        expected *= size
    return True


class _Recompute(TorchDispatchMode):
    """The recomputation: each op takes its cache entry, in the forward's order per op overload."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __init__(self, cache: dict, store: HostStore, fqn: str):
        super().__init__()
        self.cache, self.store, self.fqn = cache, store, fqn
        self.counters: dict[Any, int] = {}

    def __enter__(self) -> Any:
        self.counters = {}
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SAC_IGNORED_OPS:
            return func(*args, **kwargs)
        idx = self.counters.get(func, 0)
        self.counters[func] = idx + 1
        slot = self.cache.get(func, [])
        if idx >= len(slot):
            raise RuntimeError(f"module {self.fqn!r}: the recomputation runs {func} (call {idx}) that its forward "
                               f"did not: the region is nondeterministic or depends on global state that changed")
        e = slot[idx]
        if e is _CONSUMED:
            raise RuntimeError(f"module {self.fqn!r}: a second backward through a selectively checkpointed region "
                               f"is not allowed")
        if e is _RECOMPUTE:
            return func(*args, **kwargs)
        slot[idx] = _CONSUMED
        if isinstance(e, _Offloaded):
            return tree_map(lambda a: a.on(self.store.take(a.handle)) if isinstance(a, _Alias) else a, e.value)
        return e

    def __exit__(self, *exc: Any) -> Any:
        for slot in self.cache.values():  # early stop: the offloaded entries not reached let go of their copies
            for i, e in enumerate(slot):
                if isinstance(e, _Offloaded):
                    for a in tree_leaves(e.value):
                        if isinstance(a, _Alias):
                            self.store.release(a.handle)
                    slot[i] = _CONSUMED
        return super().__exit__(*exc)


def offload_contexts(policy: Any, store: HostStore, fqn: str, module: nn.Module,
                     per_call: bool = False) -> tuple[Any, Any]:
    """The (forward, recomputation) context pair for one checkpointed call of ``module`` (``fqn``), whose
    ``policy`` (a selective-checkpoint policy function) may return ``MUST_CPU_OFFLOAD``; ``per_call``: the
    module is called more than once, and this call's offloads leave the device when its forward ends."""
    cache: dict[Any, list] = {}
    return _Forward(policy, cache, store, fqn, module, per_call), _Recompute(cache, store, fqn)

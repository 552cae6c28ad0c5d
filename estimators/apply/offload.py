"""The host store: offloaded activations, window by window, on the plan's protocol.

A plan with offloading (``Plan.offload_windows``) cuts the forward into
windows; window ``j`` ends when the forward of ``offload_windows[j].end_module``
ends ("" is the root, whose forward ends the last window). What a checkpointed
call in window ``j`` offloads is:

* copied to host memory when the call's forward ends (all its offloaded
  outputs at once, after every write the region makes to them), while the
  device tensor stays in window ``j``'s stash;
* dropped from the device when the forward of window ``j+1``'s end module ends
  (on CUDA the compute stream first waits for window ``j``'s copies): from
  then on its storage must be dead, else the offload freed nothing and
  :class:`PlanMismatchError` says so, naming the op;
* fetched back to a fresh device tensor when the backward of window ``j+1``'s
  end module starts (a prefetch one window ahead), and given to the
  recomputation of its call, which holds it like a saved output until its last
  use.

A module called more than once (the plan's ``offload_calls``) offloads per call instead: each call's
offloaded outputs are copied and dropped from the device when that call's forward ends
(:meth:`HostStore.drop_call`), and its recomputation fetches them back when it takes them, so they are off the
device exactly where that call's discard is (docs/memory-model.md, "Offloading").

So window ``j``'s bytes are off the device exactly from the forward end of
window ``j+1``'s end module to the backward start of the same module, which is
what the planner's memory model counts (docs/memory-model.md). The hooks that
mark these moments, eagerly or as ops of a compiled graph, are
:mod:`estimators.apply.offload_windows`.

Two ways to copy: on CUDA pinned host buffers, one copy stream per device and
events, the device tensor kept in the stash until its copy is waited for
(deterministic free points, no ``record_stream``); on the CPU (this machine's
stand-in) a synchronous copy into a fresh storage made under
:func:`estimators.common.host_side`, so the step trackers book it as host
memory and the device storage really dies. Never ``.cpu()``: on a CPU tensor
that returns the same storage, a relabel and no free.
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from estimators.apply.policy import PlanMismatchError
from estimators.common import host_side, tensors_in

__all__ = ["Handle", "HostStore", "offload_decisions"]

_RUNNING: list[HostStore] = []  # the store whose model's forward runs now (compiled kernels find it here)
_WITH_COPIES: weakref.WeakSet = weakref.WeakSet()  # stores whose host copies a compiled graph may hand back
_BY_KEY: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # stores by key (the window ops' argument)
_KEYS = itertools.count(1)  # never reused: a graph compiled for a store that is gone must not reach another


@dataclass(eq=False)
class Handle:
    """One offloaded storage: its host copy, the device tensor while it is stashed, the fetched copy."""

    label: str  # "module 'm': op k (aten.x)", for messages
    key: int  # the device storage's address while it is stashed (one handle per storage and pass)
    device: torch.device
    host: torch.Tensor | None
    stashed: torch.Tensor | None  # the device tensor, until the window protocol drops it
    version: int  # the device tensor's version when copied: a later write would make the host copy stale
    source: weakref.ref = field(repr=False)  # the device tensor (its version, while it lives)
    storage: weakref.ref = field(repr=False)  # its storage: dead once dropped, or the offload freed nothing
    nbytes: int
    copied: Any = None  # CUDA: the event after the device-to-host copy
    fetched: torch.Tensor | None = None
    arrived: Any = None  # CUDA: the event after the host-to-device copy
    users: int = 0  # cache entries still to take it in the recomputation
    window: int = 0  # its window, and its forward's serial number (the in-graph prefetch finds it so)
    serial: int = 0


@dataclass(eq=False)
class _Pass:
    """One forward of the model: the handles of each window, and the window running now."""

    windows: list[list[Handle]]
    serial: int = 0  # the store's count of forwards when this one started
    window: int = 0
    by_storage: dict[int, Handle] = field(default_factory=dict)  # stashed handles, by their storage's address


def _version(t: torch.Tensor) -> int:
    """The tensor's version counter (bumped by every in-place write)."""
    return t._version  # layout: allow-private (a tensor's version counter has no public accessor)


def _like(base: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``base``'s storage with ``t``'s geometry (``base`` itself when they agree)."""
    if (base.shape, base.stride(), base.storage_offset()) == (t.shape, t.stride(), t.storage_offset()):
        return base
    return base.as_strided(t.shape, t.stride(), t.storage_offset())


class HostStore:
    """Host copies of offloaded activations, kept and brought back by window (see the module doc)."""

    def __init__(self, end_modules: list[str]):
        self.end_modules = list(end_modules)
        self.current: _Pass | None = None
        self.host_bytes = 0  # live host bytes now
        self.host_peak_bytes = 0
        self.offloaded_bytes = 0  # copied in the last forward
        self.streams: dict[torch.device, Any] = {}
        self.by_host: dict[int, Handle] = {}  # compiled path: handles by their host copy's address, until taken
        self.fqn_by_id: dict[int, str] = {}  # compiled path: module names for messages, by the module's id
        self.compiled = False  # apply_plan set up the compiled path (its joint pass) for this store's model
        self.passes = 0  # forwards started (each pass's serial number)
        self.on_host: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # handles in offload order,
        # while a cache entry or a compiled graph holds them (the in-graph prefetch looks for its window here)
        self.order = itertools.count()
        self.stalled_fetches = 0  # copies a backward took before any prefetch brought them (each a wait)
        self.key = next(_KEYS)  # an int a compiled graph can carry: the window ops' argument
        _BY_KEY[self.key] = self

    @staticmethod
    def by_key(key: int) -> HostStore:
        """The store whose :attr:`key` is ``key`` (the window ops of a compiled graph name their store so)."""
        store = _BY_KEY.get(key)
        if store is None:
            raise RuntimeError(f"a sacplan window op names host store {key}, which is gone (the plan was removed "
                               f"and the model not recompiled)")
        return store

    # ---- forward ----
    def start_pass(self) -> None:
        """A forward of the model starts: new windows (the previous forward's handles stay with its graph)."""
        self.passes += 1
        self.current = _Pass([[] for _ in self.end_modules], serial=self.passes)
        self.offloaded_bytes = 0
        _RUNNING[:] = [self]

    @staticmethod
    def running() -> HostStore:
        """The store of the model whose forward runs now (for the compiled path's kernels)."""
        if not _RUNNING:
            raise RuntimeError("sacplan::to_host ran outside a planned model's forward (no host store is running)")
        return _RUNNING[0]

    @staticmethod
    def holding(host: torch.Tensor) -> HostStore:
        """The store that made the host copy ``host`` (:meth:`host_copy`): a backward may run after another
        model's forward."""
        key = host.untyped_storage().data_ptr()
        store = next((s for s in list(_WITH_COPIES) if key in s.by_host), None)
        if store is None:
            raise RuntimeError("sacplan::from_host got a tensor that is no host copy of a store")
        return store

    def host_copy(self, t: torch.Tensor, label: str) -> torch.Tensor:
        """The compiled path's forward: offload ``t`` (:meth:`offload`) and return its host copy, which the
        compiled graph saves for its backward in place of ``t``."""
        h = self.offload(t, label)
        key = h.host.untyped_storage().data_ptr()
        self.by_host[key] = h
        _WITH_COPIES.add(self)
        # one alias per call, each a user of the handle until it dies: the graph drops the ones its backward
        # does not read in the forward, the others once its backward has fetched them (an op and its
        # _unsafe_view share one storage, one copy, each with its own geometry). Not a view (set_ on an empty
        # tensor): AOTAutograd saves a view for the backward as a detached alias, so the object returned here
        # would die in the forward while its storage lives on
        with torch.no_grad():
            alias = torch.empty((0,), dtype=t.dtype, device="cpu").set_(
                h.host.untyped_storage(), t.storage_offset(), t.shape, t.stride())
        weakref.finalize(alias, self._view_died, h, key)
        return alias

    def _view_died(self, h: Handle, key: int) -> None:
        h.users -= 1
        if h.users <= 0:
            self.by_host.pop(key, None)
            if h.stashed is None:  # else the window's drop lets go (a later op may still share the storage)
                self._let_go(h)

    def device_copy(self, host: torch.Tensor) -> torch.Tensor:
        """The compiled path: the device tensor of the host copy ``host`` made by :meth:`host_copy`; in the
        forward (still stashed) the device tensor itself, in the backward the fetched copy (fetched now if no
        prefetch did: a stall). It lives while a view of the host copy does."""
        h = self.by_host[host.untyped_storage().data_ptr()]
        if h.stashed is not None:
            return _like(h.stashed, host)
        self._fetch_now(h)
        if h.arrived is not None:
            torch.cuda.current_stream(h.device).wait_event(h.arrived)
        return _like(h.fetched, host)

    def offload(self, t: torch.Tensor, label: str, per_call: bool = False) -> Handle:
        """Copy ``t`` to the host (once per storage per window) and stash it in the window running now; with
        ``per_call`` (a module called more than once) in no window: :meth:`drop_call` drops it when the call's
        forward ends."""
        p = self.current
        if p is None:
            self.start_pass()
            p = self.current
        key = t.untyped_storage().data_ptr()
        same = p.by_storage.get(key)
        if same is not None:
            same.users += 1
            return same
        if not per_call and p.window >= len(p.windows) - 1:
            raise PlanMismatchError(f"{label} is offloaded in the last offload window (it ends with the model's "
                                    f"forward, '{self.end_modules[-1]}'): no later window drops it, so it frees "
                                    f"nothing; the plan must save it")
        host, copied = self.to_host(t)
        h = Handle(label, key, t.device, host, t, _version(t), weakref.ref(t), weakref.ref(t.untyped_storage()),
                   t.untyped_storage().nbytes(), copied, users=1, window=-1 if per_call else p.window,
                   serial=p.serial)
        if not per_call:  # (window -1: no in-graph prefetch takes it; its call's recomputation fetches it)
            p.windows[p.window].append(h)
        p.by_storage[key] = h
        self.on_host[next(self.order)] = h
        self.offloaded_bytes += h.nbytes
        self.host_bytes += h.nbytes
        self.host_peak_bytes = max(self.host_peak_bytes, self.host_bytes)
        return h

    def _stream(self, device: torch.device) -> Any:
        if device not in self.streams:
            self.streams[device] = torch.cuda.Stream(device)
        return self.streams[device]

    def to_host(self, t: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """A host copy of ``t`` in a storage of its own, and the CUDA event after the copy (None on the CPU)."""
        with torch.no_grad(), host_side():
            if t.device.type != "cuda":  # the CPU stand-in: a fresh storage, a synchronous copy
                host = torch.empty_like(t, device="cpu")
                host.copy_(t)
                return host, None
            compute, copy = torch.cuda.current_stream(t.device), self._stream(t.device)
            copy.wait_stream(compute)  # t is complete on the compute stream
            host = torch.empty_like(t, device="cpu", pin_memory=True)
            with torch.cuda.stream(copy):
                host.copy_(t, non_blocking=True)
                copied = torch.cuda.Event()
                copied.record(copy)
            return host, copied

    def window_ended(self, index: int, outputs: Any) -> None:
        """The forward of end module ``index`` ended: the window after it starts; window ``index - 1`` leaves the
        device, and the backward of this module's call will bring it back first."""
        p = self.end_window(index)
        wanting = [t for t in tensors_in(outputs) if t.requires_grad]
        if p is not None and wanting and p.windows[index - 1]:
            torch.autograd.graph.register_multi_grad_hook(
                wanting, lambda grads, p=p, j=index - 1: self._fetch_window(p, j), mode="any")

    def end_window(self, index: int) -> _Pass | None:
        """The forward moment of :meth:`window_ended`: the running pass's window ``index - 1`` is dropped from the
        device; returns the pass if it did (None for window 0's end, a repeated call of the end module, or no
        pass)."""
        p = self.current
        if p is None or p.window != index:  # a repeated call of the end module, or a forward with no pass
            return None
        p.window += 1
        if index == 0:
            return None
        self._drop(p, index - 1)
        return p

    def drop_call(self, handles: list[Handle]) -> None:
        """A call of a module offloading per call ended its forward: its offloaded storages leave the device now
        (on CUDA the compute stream first waits for their copies), checked freed as a window's are."""
        p = self.current
        if p is not None and handles:
            self._drop_handles(p, handles, "its call")

    def _drop(self, p: _Pass, j: int) -> None:
        self._drop_handles(p, p.windows[j], f"window {j}")

    def _drop_handles(self, p: _Pass, handles: list[Handle], where: str) -> None:
        t = None
        for h in handles:
            t = h.stashed
            if t is not None and _version(t) != h.version:
                raise PlanMismatchError(f"{h.label} is written in place after its copy to the host (version "
                                        f"{h.version} -> {_version(t)}): the host copy would be stale; the plan "
                                        f"must save it instead of offloading it")
            if h.copied is not None:
                torch.cuda.current_stream(h.device).wait_event(h.copied)  # the copy has read it: free on compute
            h.stashed = None
            p.by_storage.pop(h.key, None)
            if h.users <= 0:  # compiled: no graph saved a view of its copy for the backward
                self._let_go(h)
        del t
        alive = [h for h in handles if h.storage() is not None]
        if alive:
            raise PlanMismatchError(
                f"{alive[0].label}: offloading it frees nothing, its device storage is still referenced after "
                f"the window protocol dropped it ({len(alive)} such storage(s) in {where}). Likely cause: it "
                f"is the module's output or aliases a region input, which the next module or autograd outside "
                f"the checkpoint still holds; the plan must save it instead")

    # ---- backward ----
    def _fetch_window(self, p: _Pass, j: int) -> None:
        for h in p.windows[j]:
            self.fetch(h)

    def fetch_window(self, j: int) -> list[torch.Tensor]:
        """The in-graph prefetch (an op of a compiled graph carries no pass): fetch window ``j`` of the latest
        forward whose window ``j`` is still on the host; returns the fetched device tensors. Backwards run their
        forwards' passes last first; a fetch this misses is made where the backward takes the copy (a stall,
        never a wrong tensor)."""
        waiting = [h for h in list(self.on_host.values())
                   if h.window == j and h.host is not None and h.fetched is None]
        latest = max((h.serial for h in waiting), default=None)
        fetched = []
        for h in waiting:
            if h.serial == latest:
                self.fetch(h)
                fetched.append(h.fetched)
        return fetched

    def fetch(self, h: Handle) -> None:
        """Bring ``h`` back to a fresh device tensor (a no-op if it is back or taken)."""
        if h.fetched is not None or h.host is None:
            return
        src = h.source()
        if src is not None and _version(src) != h.version:
            raise PlanMismatchError(f"{h.label} was written in place after its copy to the host: the host copy "
                                    f"is stale; the plan must save it instead of offloading it")
        with torch.no_grad():
            dev = torch.empty_like(h.host, device=h.device)  # device memory again: no host_side here
            if h.device.type == "cuda":
                compute, copy = torch.cuda.current_stream(h.device), self._stream(h.device)
                copy.wait_stream(compute)  # dev's block may have been in use on the compute stream
                with torch.cuda.stream(copy):
                    dev.copy_(h.host, non_blocking=True)  # the pinned allocator records this use of h.host
                    h.arrived = torch.cuda.Event()
                    h.arrived.record(copy)
            else:
                dev.copy_(h.host)
        h.fetched, h.host = dev, None
        self.host_bytes -= h.nbytes

    def _fetch_now(self, h: Handle) -> None:
        if h.fetched is None and h.host is not None:
            self.stalled_fetches += 1
        self.fetch(h)

    def take(self, h: Handle) -> torch.Tensor:
        """The fetched device tensor for one cache entry of ``h`` (fetched now if no prefetch did: a stall)."""
        self._fetch_now(h)
        dev = h.fetched
        if dev is None:
            raise RuntimeError(f"{h.label}: its offloaded copy was already taken (a second backward through a "
                               f"selectively checkpointed region is not allowed)")
        if h.arrived is not None:
            torch.cuda.current_stream(h.device).wait_event(h.arrived)
        self.release(h)
        return dev

    def release(self, h: Handle) -> None:
        """One cache entry of ``h`` is done with it (taken, or left by an early-stopped recomputation)."""
        h.users -= 1
        if h.users <= 0:
            self._let_go(h)

    def _let_go(self, h: Handle) -> None:
        """No cache entry or compiled graph will take ``h``: its fetched and host copies go."""
        if h.fetched is not None:
            if h.arrived is not None:  # an unused copy still in flight: its block is freed on the compute stream
                torch.cuda.current_stream(h.device).wait_event(h.arrived)
            h.fetched = None
        if h.host is not None:
            h.host = None
            self.host_bytes -= h.nbytes


def offload_decisions(i: int, pm: Any, fqn: str, save: tuple[int, ...],
                      names: list[str] | None, view: list[bool] | None) -> tuple[int, ...] | None:
    """The plan's ``modules[i].offload`` list, checked against ``save`` and the ops' view flags; None if absent."""
    offload = pm.get("offload")
    if offload is None:
        return None
    if not isinstance(offload, (list, tuple)) or any(o not in (0, 1) for o in offload):
        raise ValueError(f"plan modules[{i}].offload must be a list of 0/1, got {offload!r}")
    if len(offload) != len(save):
        raise ValueError(f"plan modules[{i}].offload has {len(offload)} decisions but save has {len(save)}")
    for k, (o, s) in enumerate(zip(offload, save)):
        what = f"op {k}" + (f" ({names[k]})" if names is not None else "")
        if o and not s:
            raise PlanMismatchError(f"module {fqn!r}: {what} has offload=1 but save=0: only a saved output can be "
                                    f"offloaded (plan modules[{i}])")
        if o and view is not None and view[k]:
            raise PlanMismatchError(f"module {fqn!r}: {what} is a view and has offload=1: views are recomputed, "
                                    f"offload the op that made its base (plan modules[{i}])")
    return tuple(int(o) for o in offload)

"""Storage bookkeeping for the collector: live bytes per category, by weak reference.

Every tensor storage the step creates is registered once, with its bytes and
a category (parameter, activation, gradient, ...). A weak reference callback
takes it off the books when the storage is freed, so the live totals follow
the step exactly as a caching allocator would see it (fake tensors included:
their storages are real ``StorageImpl`` objects without data).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten

__all__ = ["ACT", "BUFFER", "CATEGORIES", "COMM", "GRAD", "INPUT", "OPT", "PARAM", "TEMP", "StorageBook", "tensors_in",
           "storages_of", "follow_storage_resizes", "local_shards"]

PARAM, BUFFER, INPUT, ACT, TEMP, GRAD, OPT = "param", "buffer", "input", "act", "temp", "grad", "opt"
COMM = "fsdp"  # FSDP2's gathered parameters and collective buffers (estimators.collect.fsdp)
CATEGORIES = (PARAM, BUFFER, INPUT, ACT, TEMP, GRAD, OPT, COMM)


def tensors_in(tree: object) -> list[torch.Tensor]:
    flat, _ = tree_flatten(tree)
    return [t for t in flat if isinstance(t, torch.Tensor)]


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (what it holds in memory); any other tensor itself."""
    if isinstance(t, DTensor):
        with torch.no_grad():
            return t.to_local()
    return t


def local_shards(tree: object) -> object:
    """The pytree with each DTensor replaced by its shard on this rank (what the rank computes on and holds)."""
    from torch.utils._pytree import tree_map

    return tree_map(lambda x: _local(x) if isinstance(x, DTensor) else x, tree)


def _storage_id(st: torch.UntypedStorage) -> int:
    # The StorageImpl's address: views share it, and fake storages have no data pointer to tell them apart.
    return st._cdata  # layout: allow-private (a storage's only identity)


def _holding(t: torch.Tensor) -> list[torch.Tensor]:
    """The tensors whose storages hold ``t``'s data: a wrapper subclass's inner tensors (a DTensor's shard, an
    AsyncCollectiveTensor's result: the wrapper's own storage is a placeholder without data), else ``t``.

    Followed down: a DTensor's shard may itself be a wrapper (a sequence-parallel residual stream is a DTensor
    over an AsyncCollectiveTensor, the eager result of a row-wise layer's reduce-scatter), whose placeholder
    storage has the shard's size but no data; each view of the DTensor (FSDP2's pre-forward views every input
    of a unit) has a placeholder of its own, so counting placeholders counted the shard again, once per view."""
    if isinstance(t, DTensor):
        return _holding(_local(t))
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        return [x for name in names for x in _holding(getattr(t, name))]
    return [t]


def storages_of(tree: object) -> list[torch.UntypedStorage]:
    """Distinct storages of the tensors in a pytree (outputs, args); a wrapper subclass by its inner tensors."""
    seen: dict[int, torch.UntypedStorage] = {}
    for t in (x for held in tensors_in(tree) for x in _holding(held)):
        if t.layout != torch.strided:
            continue
        st = t.untyped_storage()
        seen.setdefault(_storage_id(st), st)
    return list(seen.values())


@dataclass
class _Entry:
    serial: int
    nbytes: int
    category: str
    ref: weakref.ref = field(repr=False)


class StorageBook:
    """Live storages and bytes per category; ``serial`` numbers never repeat."""

    def __init__(self, round_to: int = 1):
        self.round_to = round_to
        self.live: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        self._entries: dict[int, _Entry] = {}
        self._serial = 0
        self.on_alloc: list = []  # callables(category, live) run after each new storage

    def nbytes(self, st: torch.UntypedStorage) -> int:
        n = st.nbytes()
        return math.ceil(n / self.round_to) * self.round_to if n else 0

    def serial(self, st: torch.UntypedStorage) -> int | None:
        e = self._entries.get(_storage_id(st))
        return e.serial if e else None

    def category(self, st: torch.UntypedStorage) -> str | None:
        e = self._entries.get(_storage_id(st))
        return e.category if e else None

    def add(self, st: torch.UntypedStorage, category: str) -> tuple[int, bool]:
        """Register ``st`` if new; return (serial, was_new)."""
        key = _storage_id(st)
        e = self._entries.get(key)
        if e is not None:
            return e.serial, False
        self._serial += 1
        n = self.nbytes(st)

        def _freed(_ref: weakref.ref, key: int = key, serial: int = self._serial) -> None:
            entry = self._entries.get(key)
            if entry is not None and entry.serial == serial:
                del self._entries[key]
                self.live[entry.category] -= entry.nbytes

        self._entries[key] = _Entry(self._serial, n, category, weakref.ref(st, _freed))
        self.live[category] += n
        for fn in self.on_alloc:
            fn(category, self.live)
        return self._serial, True

    def recategorize_all(self, storages: Iterable[torch.UntypedStorage], category: str) -> None:
        for st in storages:
            self.recategorize(st, category)

    def resized(self, st: torch.UntypedStorage, category: str) -> None:
        """``st`` was resized in place (FSDP2 frees and re-gathers parameters so): follow its new size.

        A storage the book does not know yet is registered in ``category``.
        """
        e = self._entries.get(_storage_id(st))
        if e is None:
            if st.nbytes():
                self.add(st, category)
            return
        n = self.nbytes(st)
        grew = n > e.nbytes
        self.live[e.category] += n - e.nbytes
        e.nbytes = n
        if grew:
            for fn in self.on_alloc:
                fn(e.category, self.live)

    def add_tensors(self, tensors: Iterable[torch.Tensor], category: str) -> None:
        for st in storages_of(list(tensors)):
            self.add(st, category)

    def recategorize(self, st: torch.UntypedStorage, category: str) -> None:
        e = self._entries.get(_storage_id(st))
        if e is None:
            self.add(st, category)
            return
        if e.category != category:
            self.live[e.category] -= e.nbytes
            self.live[category] += e.nbytes
            e.category = category


@contextmanager
def follow_storage_resizes(book: StorageBook, category: Callable[[], str]) -> Iterator[None]:
    """While open, ``book`` follows ``UntypedStorage.resize_`` (no dispatcher op sees it).

    FSDP2 frees a unit's gathered parameters by resizing their storages to 0
    and gathers them again by resizing them back; a storage the book does not
    know yet is booked in ``category()``.
    """
    original = torch.UntypedStorage.resize_

    def resize_(storage: torch.UntypedStorage, size: int) -> object:
        out = original(storage, size)
        book.resized(storage, category())
        return out

    torch.UntypedStorage.resize_ = resize_
    try:
        yield
    finally:
        torch.UntypedStorage.resize_ = original

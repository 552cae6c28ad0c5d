"""Which storages belong to the host: the flag an offloading store raises while it makes host copies.

Offloading moves an activation out of the memory a plan budgets (the device's)
into host memory. On a GPU the two are told apart by the device; on this
machine's CPU stand-in both are CPU storages, so the step trackers
(:mod:`estimators.measure`) need to be told: a storage an op returns while
:func:`host_side` is open is booked into a separate host book, never as device
memory. The store (:mod:`estimators.apply`) opens it only around the host
copies it makes, so what it fetches back is device memory again.

Hiding the copies from the dispatcher instead (no mode sees them) would make
the measurement blind to them rather than separate.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

from estimators.common.storage_book import ACT, StorageBook, storages_of

__all__ = ["HOST_COPY_OPS", "HostBook", "host_side", "is_host_side", "makes_host_copy"]

# Ops whose output is a host copy made inside their kernel (which no dispatch mode sees): the compiled path's
# offload op (estimators/apply/offload_compile.py); a tracker books its output as host memory
HOST_COPY_OPS = frozenset({"sacplan.to_host"})

_HOST_SIDE: contextvars.ContextVar[bool] = contextvars.ContextVar("sacplan_host_side", default=False)


@contextmanager
def host_side() -> Iterator[None]:
    """While open, storages made by ATen ops are host memory (booked apart by the step trackers)."""
    token = _HOST_SIDE.set(True)
    try:
        yield
    finally:
        _HOST_SIDE.reset(token)


def is_host_side() -> bool:
    """Whether :func:`host_side` is open here."""
    return _HOST_SIDE.get()


def makes_host_copy(func: object) -> bool:
    """Whether ``func`` (an op a dispatch mode sees) returns a host copy (:data:`HOST_COPY_OPS`)."""
    packet = getattr(func, "overloadpacket", None)
    return packet is not None and str(packet) in HOST_COPY_OPS


class HostBook:
    """The host memory a step tracker saw made under :func:`host_side`: live bytes, by weak reference, and their peak.

    ``peak_bytes`` is None until a host storage is made (since the last :meth:`restart`), so a step that offloaded
    nothing reports no host figures at all.
    """

    def __init__(self) -> None:
        self.book = StorageBook()
        self.peak_bytes: int | None = None
        self.book.on_alloc.append(self._on_alloc)

    def live_bytes(self) -> int:
        """Host bytes live now."""
        return sum(self.book.live.values())

    def add(self, out: object) -> None:
        """Book the storages of an op's outputs as host memory."""
        for st in storages_of(out):
            self.book.add(st, ACT)

    def restart(self) -> None:
        """A new step: the peak starts again from what is live (None if nothing is)."""
        live = self.live_bytes()
        self.peak_bytes = live or None

    def _on_alloc(self, category: str, live: dict[str, int]) -> None:
        self.peak_bytes = max(self.peak_bytes or 0, sum(live.values()))

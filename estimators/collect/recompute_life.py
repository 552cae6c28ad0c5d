"""What a module's recompute holds at once: when each forward storage died, and where the recompute runs.

Checkpointed, a module re-runs its forward in its backward (up to its early
stop), and for that while the storages its ops make live side by side with
everything its backward holds: the ones autograd saves (which the plain
step holds anyway), and temporaries no op saves (SDPA's math path under
CPU autocast: a score matrix, its dropout) that the plain step freed in its
forward. The recompute keeps each storage as long as the forward did (the
same code holds the same references) or until it stops, so the forward's
lifetimes tell the planner what a recompute holds for any save list
(``planner.memory_model.recompute_transient_bytes``). The recompute runs
when the backward first unpacks a tensor the module's forward saved: that
moment's key is the module's ``recompute_key``. Under ``aot_eager`` it also
notes which forward ops take each storage: what the compiled step keeps of
an op a plan saves (:meth:`RecomputeLife.compiled_kept_bytes`).
"""

from __future__ import annotations

import bisect
import weakref
from collections.abc import Callable
from typing import Any

import torch

from estimators.common import PARAM, TEMP, storages_of, tensors_in

__all__ = ["RecomputeLife"]


class RecomputeLife:
    """Per forward storage, how many ops the collector had recorded when it died; per module, its first unpack."""

    def __init__(self) -> None:
        self.freed_at: dict[int, int] = {}  # serial -> recorded ops when freed (its last live op is one less)
        self._refs: dict[int, weakref.ref] = {}
        # fqn -> (micro-batch, backward events so far, live bytes but parameters) at its first unpack
        self.first_unpack: dict[str, tuple[int | None, int, int]] = {}
        # under aot_eager: serial -> the ops (global indices) of the first micro-batch's forward that took it
        self.compiled: bool = False
        self.taken_by: dict[int, list[int]] = {}
        # serial -> recorded ops when freed in a forward whose autograd saved nothing (as under checkpointing for
        # the ops a plan recomputes); None: not known (no such forward, or it ran other ops)
        self.unsaved_freed_at: dict[int, int] | None = None

    def taken(self, col: Any, args: Any, index: int) -> None:
        """Op ``index`` of the forward takes the tensors in ``args`` (noted under ``aot_eager`` only)."""
        if self.compiled and col.timeline.micro_batch in (None, 1):
            for st in {id(s): s for t in tensors_in(args) for s in storages_of(t)}.values():
                if (serial := col.book.serial(st)) is not None:
                    self.taken_by.setdefault(serial, []).append(index)

    def compiled_kept_bytes(self, new_storages: Any, fqn: str, saved_in: dict[int, set[str]],
                            module_ops: set[int], after: int) -> int:
        """What the compiled step keeps of the storages an op made when a checkpointed module ``fqn`` saves it.

        A storage the module's backward needs (its forward saved it), or one a later op of the module takes
        (``module_ops``: the global indices of those that may be recomputed; later: above ``after``). The
        partitioner keeps no other output of a saved op, where eager checkpointing caches them all (of a
        dropout whose result only leaves the module, its mask).
        """
        def kept(serial: int) -> bool:
            return fqn in saved_in.get(serial, ()) or any(
                j > after and j in module_ops for j in self.taken_by.get(serial, ()))

        return sum(nbytes for serial, nbytes in new_storages if kept(serial))

    def compiled_takers(self, new_storages: Any, module_ops: list[int], may_recompute: set[int], after: int
                        ) -> list[int] | None:
        """Under ``aot_eager``: the positions in ``module_ops`` of the later ops (above ``after``, in
        ``may_recompute``) that take a storage the op made; None when not compiled."""
        if not self.compiled:
            return None
        taken = {j for serial, _ in new_storages for j in self.taken_by.get(serial, ())
                 if j > after and j in may_recompute}
        takers = sorted(bisect.bisect_left(module_ops, j) for j in taken)  # module_ops ascends; may_recompute in it
        return takers if len(takers) <= 4096 else None  # the format's limit; unknown counts as read

    def watch(self, st: torch.UntypedStorage, serial: int, col: Any) -> None:
        """Note when a storage made in the first micro-batch's forward dies."""
        if col.timeline.micro_batch not in (None, 1):
            return
        ops = col.ops  # the first micro-batch's list (later micro-batches record apart)

        def _freed(_ref: weakref.ref, serial: int = serial) -> None:
            self.freed_at[serial] = len(ops)
            self._refs.pop(serial, None)

        self._refs[serial] = weakref.ref(st, _freed)

    def unpack_hook(self, col: Any) -> Callable[[tuple[torch.Tensor, tuple[str, ...]]], torch.Tensor]:
        """The unpack half of the collector's ``saved_tensors_hooks``: its pack returns (tensor, the modules whose
        forward saved it), each pack apart (a tensor several modules save is unpacked by each in its backward)."""
        def unpack(packed: tuple[torch.Tensor, tuple[str, ...]]) -> torch.Tensor:
            t, fqns = packed
            if fqns and col.phase == TEMP:
                self.unpacked(fqns, col.timeline, sum(col.book.live.values()) - col.book.live[PARAM])
            return t

        return unpack

    def unpacked(self, fqns: tuple[str, ...], timeline: Any, live_bytes: int) -> None:
        """The backward unpacked a tensor the forwards of ``fqns`` saved, with ``live_bytes`` live (parameters aside)."""
        for fqn in fqns:
            self.first_unpack.setdefault(fqn, (*timeline.position(), live_bytes))

    def match_unsaved(self, ops: list, shadow: list, shadow_life: RecomputeLife) -> None:
        """Take the deaths of a forward run again with nothing saved (``shadow``, its storages watched by
        ``shadow_life``) for the step's storages, op by op and storage by storage, when it ran the same ops."""
        if len(ops) != len(shadow) or any(a.name != b.name or len(a.new_storages) != len(b.new_storages)
                                          for a, b in zip(ops, shadow)):
            return
        freed = shadow_life.freed_at
        self.unsaved_freed_at = {serial: freed[other] for a, b in zip(ops, shadow)
                                 for (serial, _), (other, _) in zip(a.new_storages, b.new_storages) if other in freed}

    def last_live_op(self, serial: int, module_ops: list[int], *, unsaved: bool = False) -> int:
        """The index among ``module_ops`` (global op indices, ascending) of the last op run while the storage was
        live; ``len(module_ops)`` if it outlived them. ``unsaved``: in the forward that saved nothing."""
        freed = (self.unsaved_freed_at or {}).get(serial) if unsaved else self.freed_at.get(serial)
        if freed is None or freed > module_ops[-1]:
            return len(module_ops)
        lo, hi = 0, len(module_ops)  # the last k with module_ops[k] < freed
        while lo < hi:
            mid = (lo + hi) // 2
            if module_ops[mid] < freed:
                lo = mid + 1
            else:
                hi = mid
        return lo - 1

"""What a checkpointed module's own forward holds beyond the step without checkpointing, per forward moment.

While checkpointed module c runs its forward under a selective policy with save list S, two things differ from
the plain step at its op j:

* kept_S(j): selective checkpointing caches a saved op's outputs from the op on, until c's backward; the plain
  step frees the ones no op saves for backward after their last use (an attention's score matrix once the mask
  is added, a query projection once scaled): their bytes where the plain step has freed them by op j;
* freed_S(j): autograd saves nothing inside c, so an output the plain step keeps for backward dies at its last
  use when its op is recomputed: its bytes where that forward (``unsaved_last_ops``) has freed it by op j and
  the plain step has not.

So c's forward holds ``live(j) + kept_S(j) - freed_S(j)`` at op j (``forward_live_bytes``: the plain step's),
and a forward moment t of c (its ops' ``forward_key``) is at most the largest of these over its ops. The memory
model adds what that exceeds the moment's most live bytes (never less than 0: other instants of the span, and
what the plain step holds there, stay as they were).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from planner.stats.format import ModuleStats

__all__ = ["forward_moments_known", "forward_excess_bytes", "forward_held_bytes"]


def forward_moments_known(m: ModuleStats) -> bool:
    """Whether ``m``'s ops say where they run and what they hold (stats collected with forward moments)."""
    ops = m.ops or ()
    return bool(ops) and all(op.forward_key is not None and op.forward_live_bytes is not None
                             and (op.storages is None or op.unsaved_last_ops is not None) for op in ops)


def forward_held_bytes(m: ModuleStats, save: Sequence[int]) -> np.ndarray:
    """Per op j of ``m`` (checkpointed with ``save``): ``live(j) + kept_S(j) - freed_S(j)``, what its forward holds
    there (stats with forward moments only: :func:`forward_moments_known`)."""
    ops = m.ops or ()
    n = len(ops)
    diff = np.zeros(n + 1, dtype=np.float64)  # kept less freed, as a difference array over j
    for i, op in enumerate(ops):
        if not op.storages:
            continue
        for (nbytes, last, _), unsaved in zip(op.storages, op.unsaved_last_ops or ()):
            if save[i]:
                if last < n:  # the plain step frees it after op `last`; SAC keeps it
                    diff[last + 1] += nbytes
            elif unsaved < last:  # recomputed, it dies after op `unsaved`, where the plain step still holds it
                diff[unsaved + 1] -= nbytes
                diff[min(last, n - 1) + 1] += nbytes
    live = np.fromiter((op.forward_live_bytes for op in ops), dtype=np.float64, count=n)
    return live + np.cumsum(diff)[:n]


def forward_excess_bytes(m: ModuleStats, save: Sequence[int], plain_most: Mapping[int, float]) -> dict[int, float]:
    """Forward key -> what checkpointing ``m`` with ``save`` adds to that moment's most live bytes (``plain_most``,
    the plain step's), where it adds any; {} where the stats do not say (:func:`forward_moments_known`)."""
    if not forward_moments_known(m):
        return {}
    held = forward_held_bytes(m, save)
    keys = np.fromiter((op.forward_key for op in m.ops or ()), dtype=np.int64, count=len(held))
    out: dict[int, float] = {}
    for key in np.unique(keys).tolist():
        if key not in plain_most:
            continue
        excess = float(held[keys == key].max()) - plain_most[key]
        if excess > 0:
            out[key] = excess
    return out

"""One module's op decision as a small exact MILP, for modules whose frontier is too large to list.

Free op groups of equal (bytes, ms) are interchangeable, so they are counted
per class instead of chosen one by one: the same problem with far less symmetry.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint

from planner.highs import quiet_milp
from planner.ops.groups import FREE, RECOMPUTE, SAVE, OpGroups, settle_trivial

__all__ = ["GroupClasses", "group_classes", "best_saved_within"]


@dataclass(frozen=True)
class GroupClasses:
    """Free groups bucketed by (bytes, ms); fixed groups summarised."""

    groups: OpGroups
    class_bytes: np.ndarray  # int64
    class_ms: np.ndarray  # float64
    members: tuple[tuple[int, ...], ...]  # group indices per class
    always_saved_bytes: int
    always_saved_ms: float
    always_recomputed_bytes: int
    always_recomputed_ms: float

    @property
    def multiplicity(self) -> np.ndarray:
        return np.array([len(m) for m in self.members], dtype=np.int64)

    def save_list(self, saved_count: np.ndarray) -> list[int]:
        """Per-op decisions saving the first ``saved_count[c]`` groups of each class."""
        g = self.groups
        group_save = (g.fixed == SAVE).astype(np.int8)
        for c, members in enumerate(self.members):
            for gi in members[: int(saved_count[c])]:
                group_save[gi] = 1
        return g.op_decisions(group_save)


def group_classes(groups: OpGroups, signature: Sequence[Hashable] | None = None) -> GroupClasses:
    """Bucket free groups; free groups of zero bytes are saved, of zero ms recomputed (both exact). With
    ``signature`` (per group), groups of one class also share it (what they hold in the forward)."""
    groups, _ = settle_trivial(groups)
    fixed = groups.fixed
    buckets: dict[tuple, list[int]] = {}
    for gi in np.flatnonzero(fixed == FREE):
        extra = () if signature is None else (signature[gi],)
        buckets.setdefault((int(groups.group_bytes[gi]), float(groups.group_ms[gi]), *extra), []).append(int(gi))
    keys = list(buckets)
    saved, rec = fixed == SAVE, fixed == RECOMPUTE
    return GroupClasses(
        groups=groups,
        class_bytes=np.array([k[0] for k in keys], dtype=np.int64),
        class_ms=np.array([k[1] for k in keys], dtype=np.float64),
        members=tuple(tuple(buckets[k]) for k in keys),
        always_saved_bytes=int(groups.group_bytes[saved].sum()),
        always_saved_ms=float(groups.group_ms[saved].sum()),
        always_recomputed_bytes=int(groups.group_bytes[rec].sum()),
        always_recomputed_ms=float(groups.group_ms[rec].sum()),
    )


def best_saved_within(classes: GroupClasses, max_saved_bytes: int) -> np.ndarray | None:
    """Counts per class saving the most ms within ``max_saved_bytes``, then the fewest bytes for that.

    Two exact integer programs (lexicographic), so the answer is a
    non-dominated point. None if the always-saved ops alone exceed the cap.
    """
    cap = max_saved_bytes - classes.always_saved_bytes
    n = len(classes.class_bytes)
    if cap < 0:
        return None
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    mult = classes.multiplicity
    scale = float(max(classes.class_bytes.max(), 1))
    w = classes.class_bytes / scale
    bounds = Bounds(np.zeros(n), mult.astype(float))
    integrality = np.ones(n)
    counts = np.zeros(n, dtype=np.int64)  # saving no free group always fits (cap >= 0)
    for _ in range(4):
        res = quiet_milp(-classes.class_ms, integrality=integrality, bounds=bounds,
                   constraints=[LinearConstraint(w[None, :], -np.inf, cap / scale)],
                   options={"mip_rel_gap": 0.0, "presolve": True})
        if res.status != 0 or res.x is None:
            break  # no proven optimum: keep what fits (at worst, no free group saved)
        found = np.rint(res.x).astype(np.int64)
        used = int(found @ classes.class_bytes)
        if used <= cap:
            counts = found
            break
        cap -= 1 + used - cap  # tolerance overshoot: tighten and retry
    best_ms = float(counts @ classes.class_ms)
    tol = 1e-9 * (abs(best_ms) + 1.0)
    res = quiet_milp(w, integrality=integrality, bounds=bounds,
               constraints=[LinearConstraint(w[None, :], -np.inf, cap / scale),
                            LinearConstraint(classes.class_ms[None, :], best_ms - tol, np.inf)],
               options={"mip_rel_gap": 0.0, "presolve": True})
    if res.status == 0 and res.x is not None:
        second = np.rint(res.x).astype(np.int64)
        if int(second @ classes.class_bytes) <= cap and second @ classes.class_ms >= best_ms - tol:
            counts = second
    return counts

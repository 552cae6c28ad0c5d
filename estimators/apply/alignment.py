"""Map a plan's per-op decisions onto the ops a module actually runs.

The plan decides op by op for the sequence the collector recorded (eager
dispatch under fake tensors). A run may see a different sequence: extra
views, constants lifted by tracing, ops that ``torch.compile`` reorders,
decomposes or functionalizes. Two ways to carry the decisions over, both of
which refuse rather than guess:

* :func:`strict_decision` (online, one op at a time, for eager runs): the
  run's substantive ops (neither view-like nor a constant, see
  :data:`TOLERATED_OPS`) must be the stats' substantive ops, in order; the
  k-th substantive op takes the k-th one's decision. Views and constants
  are recomputed. Any other difference is a mismatch.
* :func:`align` (offline, for a sequence recorded while ``torch.compile``
  traced): a longest common subsequence over op names, accepted only when
  every optimal alignment gives each run op the same decision. An op the
  stats did not see is recomputed if view-like and otherwise takes the safe
  choice: recompute (it never holds more memory than the plan counted),
  except random ops, which follow the module's random rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["TOLERATED_OPS", "StatsOps", "Alignment", "AmbiguousAlignment", "align", "substantive"]

# Ops a run may add or drop without changing what the plan means: constants made from Python scalars
# (tracing lifts them) and aliases. Their decision is always "recompute" (they cost nothing to remake).
# A functional collective's wait returns its input: eager runs it where a collective's result is first used
# (inside AsyncCollectiveTensor's dispatch, unseen, or by an explicit .wait()), a trace right after the collective.
TOLERATED_OPS = frozenset({"aten.lift_fresh", "aten.lift_fresh_copy", "aten.scalar_tensor", "aten.alias",
                           "aten._local_scalar_dense", "_c10d_functional.wait_tensor"})


@dataclass(frozen=True)
class StatsOps:
    """One module's op list as the plan knows it: names, save decisions, view-like and random flags."""

    names: tuple[str, ...]
    save: tuple[int, ...]
    view: tuple[bool, ...]
    random: tuple[bool, ...]

    @property
    def random_decision(self) -> int:
        """The decision every random op of the module shares (0 if it has none)."""
        return next((s for s, r in zip(self.save, self.random) if r), 0)


@dataclass(frozen=True)
class Alignment:
    """Decisions for a recorded run sequence, and how it relates to the stats' sequence."""

    names: tuple[str, ...]
    save: tuple[int, ...]
    matched: int  # run ops matched to a stats op
    unseen: int  # run ops the stats did not see (recomputed, or random: the random rule)
    lost_saves: tuple[int, ...]  # stats ops the plan saves that the run does not have


class AmbiguousAlignment(ValueError):
    """Two equally good alignments give a run op different decisions."""

    def __init__(self, run_index: int, name: str, stats_positions: list[int], can_be_unseen: bool):
        self.run_index, self.name, self.stats_positions, self.can_be_unseen = (
            run_index, name, stats_positions, can_be_unseen)
        alt = " or an op the stats did not see" if can_be_unseen else ""
        super().__init__(f"op {run_index} ({name}) could be the stats' op {stats_positions}{alt}, "
                         f"with different save decisions")


def substantive(name: str, view: bool) -> bool:
    """Whether an op must be matched one to one in an eager run (not view-like, not a tolerated constant)."""
    return not view and name not in TOLERATED_OPS


def _lcs_tables(a: Sequence[str], b: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Prefix (F[i, j] = LCS of a[:i], b[:j]) and suffix (B[i, j] = LCS of a[i:], b[j:]) tables."""
    codes: dict[str, int] = {}
    ca = np.array([codes.setdefault(x, len(codes)) for x in a], dtype=np.int64)
    cb = np.array([codes.setdefault(x, len(codes)) for x in b], dtype=np.int64)
    n, m = len(ca), len(cb)
    fwd = np.zeros((n + 1, m + 1), dtype=np.int32)
    for i in range(n):
        cand = np.where(cb == ca[i], fwd[i, :-1] + 1, fwd[i, 1:])
        fwd[i + 1, 1:] = np.maximum.accumulate(np.maximum(cand, 0))
    bwd = np.zeros((n + 1, m + 1), dtype=np.int32)
    for i in range(n - 1, -1, -1):
        cand = np.where(cb == ca[i], bwd[i + 1, 1:] + 1, bwd[i + 1, :-1])
        bwd[i, :-1] = np.maximum.accumulate(cand[::-1])[::-1]
    return fwd, bwd


def align(stats: StatsOps, run_names: Sequence[str], run_view: Sequence[bool],
          run_random: Sequence[bool]) -> Alignment:
    """Decisions for ``run_names`` (a recorded sequence), or :class:`AmbiguousAlignment`.

    A run op takes the decision of the stats op it is aligned with; when
    several longest alignments exist, every one must give it the same
    decision (else the error). View-like and tolerated ops are recomputed
    whatever they align with; random ops take the module's random decision.
    """
    a, b = list(stats.names), list(run_names)
    fwd, bwd = _lcs_tables(a, b)
    total = int(fwd[-1, -1])
    same_name = np.array(a, dtype=object)[:, None] == np.array(b, dtype=object)[None, :]
    on_path = same_name & (fwd[:-1, :-1] + 1 + bwd[1:, 1:] == total)  # (i, j) in some longest alignment
    unseen_possible = (fwd[:, :-1] + bwd[:, 1:]).max(axis=0) == total  # j left out of some longest alignment
    save: list[int] = []
    matched_stats: set[int] = set()
    unseen = 0
    for j, name in enumerate(b):
        partners = np.flatnonzero(on_path[:, j]).tolist()
        matched_stats.update(partners)
        unseen += not partners
        if run_view[j] or name in TOLERATED_OPS:
            save.append(0)
        elif run_random[j]:
            save.append(stats.random_decision)
        else:
            options = {stats.save[i] for i in partners} | ({0} if unseen_possible[j] else set())
            if len(options) > 1:
                raise AmbiguousAlignment(j, name, partners, bool(unseen_possible[j]))
            save.append(options.pop())
    lost = tuple(i for i, s in enumerate(stats.save) if s and not stats.view[i] and i not in matched_stats)
    return Alignment(tuple(b), tuple(save), len(b) - unseen, unseen, lost)

"""What an engine answers: a typed status, and a plan's exact op decisions with its peak and recompute.

Every engine builds its answer here, so a plan's peak and recompute are
derived in one place, from its decisions and the memory model, whatever
engine chose them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from planner.memory_model import discardable_bytes
from planner.plan_format import PlanStatus
from planner.solve.offload import OffloadPlan
from planner.solve.problem import Problem

__all__ = ["Decision", "Solution", "discards", "needs_peak_bytes", "save_lists"]

Decision = tuple[list[int], int, float]  # (save list, saved bytes, saved ms) of one checkpointed module


@dataclass(frozen=True)
class Solution:
    """An engine's answer: with ``decisions`` (fqn -> Decision) when it found a plan."""

    status: PlanStatus
    message: str
    peak_bytes: float | None = None
    recompute_ms: float | None = None
    mip_gap: float | None = None
    decisions: dict[str, Decision] | None = None
    lower_bound: float | None = None  # the solver's proven bound on recompute, when it gives one
    # the plan's memory per moment (MemoryModel.profile_bytes), kept for the plan's timeline
    profile: np.ndarray | None = field(default=None, repr=False, compare=False)
    # with offload: what the plan offloads (its decisions' save lists are 1 where it offloads), else None
    offload: OffloadPlan | None = field(default=None, repr=False)

    @classmethod
    def planned(cls, prob: Problem, decisions: dict[str, Decision], status: PlanStatus, message: str,
                gap: float, lower_bound: float | None = None, offload: OffloadPlan | None = None) -> Solution:
        """A plan (``optimal`` or ``feasible``): its peak and recompute derived from the decisions (and the
        offloads' window credits, when it offloads)."""
        profile = prob.model.profile_bytes(discards(prob, decisions), saves=save_lists(decisions),
                                           offloaded=None if offload is None else offload.credits)
        recompute = math.fsum(_module_recompute_ms(prob, f, saved_ms) for f, (_, _, saved_ms) in decisions.items())
        return cls(status, message, float(profile.max()), recompute, gap, decisions, lower_bound, profile, offload)

    @property
    def overhead_ms(self) -> float | None:
        """What the plan minimises: its recompute, plus its offload stall when it offloads."""
        if self.recompute_ms is None or self.offload is None:
            return self.recompute_ms
        return self.recompute_ms + self.offload.stall_ms

    @classmethod
    def unplanned(cls, prob: Problem, message: str) -> Solution:
        """Nothing to checkpoint: the step fits as it is (optimal, no recompute)."""
        return cls("optimal", message, prob.model.peak_bytes(), 0.0, 0.0, {})

    @classmethod
    def without_plan(cls, status: PlanStatus, message: str, lower_bound: float | None = None) -> Solution:
        """``infeasible``, ``time_limit`` or ``error``: no plan, only the reason."""
        return cls(status, message, lower_bound=lower_bound)

    @classmethod
    def infeasible(cls, message: str = "no plan fits the budget") -> Solution:
        return cls.without_plan("infeasible", message)

    def with_status(self, status: PlanStatus, message: str, gap: float | None) -> Solution:
        """The same plan, re-labelled (a MILP plan judged against an earlier bound)."""
        return Solution(status, message, self.peak_bytes, self.recompute_ms, gap, self.decisions, self.lower_bound,
                        self.profile, self.offload)


def discards(prob: Problem, decisions: dict[str, Decision]) -> dict[str, float]:
    """fqn -> bytes each checkpointed module frees."""
    return {f: discardable_bytes(prob.stats.module(f)) - saved for f, (_, saved, _) in decisions.items()}


def save_lists(decisions: dict[str, Decision]) -> dict[str, list[int]]:
    """fqn -> the per-op save list of each checkpointed module."""
    return {f: save for f, (save, _, _) in decisions.items()}


def needs_peak_bytes(prob: Problem, sol: Solution) -> float:
    """A plan's peak as the engines' needs see it: without the inputs checkpointed modules hold through their
    own backward (which depend on which modules are checkpointed; ``planning.plan`` settles them)."""
    return prob.model.peak_bytes(discards(prob, sol.decisions or {}), held=False)


def _module_recompute_ms(prob: Problem, fqn: str, saved_ms: float) -> float:
    """What checkpointing one module costs: its recomputed ops, plus checkpointing's own overhead."""
    m = prob.stats.module(fqn)
    return (m.op_ms - saved_ms + (m.checkpoint_overhead_ms or 0.0)) * m.calls

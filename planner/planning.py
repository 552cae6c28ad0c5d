"""Module-level planning: which modules to checkpoint and how, under a budget."""
from __future__ import annotations

from collections.abc import Sequence

from planner.plan_format import Plan
from planner.stats import Stats

__all__ = ["plan", "sweep"]


def plan(
    stats: Stats,
    memory_budget_gib: float,
    *,
    world_size: int = 1,
    ac_units: Sequence[str] | None = None,
    fsdp_units: Sequence[str] | None = None,
    time_limit_s: float = 60.0,
    mip_rel_gap: float = 1e-6,
    include_optimizer_state: bool = False,
    reserve_gib: float = 0.0,
) -> Plan:
    """Plan for one budget (stub until the MILP lands)."""
    raise NotImplementedError


def sweep(stats: Stats, budgets_gib: Sequence[float], **options) -> list[Plan]:
    """Plans for several budgets (stub until the MILP lands)."""
    raise NotImplementedError

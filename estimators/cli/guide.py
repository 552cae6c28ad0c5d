"""What to do after ``sacplan collect``: does the step fit the target, which budgets have a plan, the next command.

Planner only (no torch): the stats just collected, the target's memory from
:mod:`estimators.collect.devices`, and real plans for a few budgets.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field

from planner import (GIB, Plan, RecomputeSplit, Stats, baseline_peak_bytes, min_feasible_budget_gib, recompute_split,
                     sharding_scope, sweep)

__all__ = ["Guidance", "guide", "WORLD_SIZES"]

# Ranks tried, in order, when the step does not fit one device even with the most checkpointing.
WORLD_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


@dataclass
class Guidance:
    """Whether the collected step fits its target, and the plans worth asking for."""

    device: str
    device_bytes: int | None  # None: the target has no fixed memory (cpu)
    baseline_bytes: int  # no checkpointing, world size 1
    min_budget_gib: float  # the smallest budget with a plan, world size 1
    world_size: int  # the smallest world size whose smallest budget fits the device (1 without a device memory)
    sharded_baseline_bytes: int  # no checkpointing at that world size
    sharded_min_budget_gib: float
    suggestions: list[Plan] = field(default_factory=list)  # real plans at a few budgets, largest budget last
    splits: list[RecomputeSplit | None] = field(default_factory=list)  # each suggestion's recompute: ops, host
    next_command: str | None = None  # the largest suggested budget whose plan checkpoints something; None: none does
    scope: str = "world size 1"  # what the figures are: one unsharded rank, or one rank of the collected sharding

    @property
    def fits_as_is(self) -> bool | None:
        """The step fits the device with no checkpointing at world size 1 (None: no device memory)."""
        return None if self.device_bytes is None else self.baseline_bytes <= self.device_bytes

    @property
    def fits_without_plan(self) -> bool:
        """The step fits the device with no checkpointing at ``world_size`` (False: no device memory)."""
        return self.device_bytes is not None and self.sharded_baseline_bytes <= self.device_bytes

    @property
    def fits_with_plan(self) -> bool | None:
        """Some plan fits the device at world size 1 (None: no device memory)."""
        return None if self.device_bytes is None else self.min_budget_gib * GIB <= self.device_bytes


def guide(stats: Stats, stats_path: str, device: str, device_bytes: int | None, *,
          time_limit_s: float = 10.0) -> Guidance:
    """Guidance for ``stats`` on a device holding ``device_bytes`` (None: unknown), with real plans."""
    world_size, min_gib = 1, min_feasible_budget_gib(stats)
    base = baseline_peak_bytes(stats)
    sharding = stats.metadata.sharding
    if device_bytes is not None and sharding is None:  # per-rank stats of a sharded job are planned as they are
        for world_size in WORLD_SIZES:
            min_gib = min_feasible_budget_gib(stats, world_size=world_size)
            if min_gib * GIB <= device_bytes:
                break
    g = Guidance(device, device_bytes, base, min_feasible_budget_gib(stats), world_size,
                 baseline_peak_bytes(stats, world_size=world_size), min_gib)
    if sharding is not None:
        g.scope = sharding_scope(sharding)
    if device_bytes is not None and min_gib * GIB > device_bytes:
        return g  # nothing fits, even sharded over the most ranks tried
    budgets = suggested_budgets(min_gib, g.sharded_baseline_bytes / GIB,
                                None if device_bytes is None else device_bytes / GIB)
    g.suggestions = sweep(stats, budgets, world_size=world_size, time_limit_s=time_limit_s)
    g.splits = [recompute_split(stats, p) for p in g.suggestions]
    # a plan that checkpoints nothing changes nothing: the next command is the largest budget that does
    planned = [p for p in g.suggestions if p.status in ("optimal", "feasible") and p.modules]
    if planned:
        command = ["sacplan", "plan", stats_path, "--budget-gib", f"{planned[-1].memory_budget_gib:g}"]
        if world_size > 1:
            command += ["--world-size", str(world_size)]
        g.next_command = shlex.join(command)
    return g


def suggested_budgets(min_gib: float, baseline_gib: float, device_gib: float | None) -> list[float]:
    """Up to three readable budgets, ascending: the smallest with a plan, one between, the most worth giving.

    The most worth giving is the device's memory (or, without one, just under
    what the step needs with no checkpointing); the one between lies halfway
    to the smaller of that and the no-checkpointing peak. Three significant
    digits, rounded inward: the smallest still has a plan, the largest fits;
    more where the smallest budget and the no-checkpointing peak are closer
    than ten such steps (else the smallest, rounded up, might need no plan).
    """
    top = baseline_gib if device_gib is None else device_gib
    step = 10.0 ** (math.floor(math.log10(top)) - 2) if top > 0 else 1.0
    if baseline_gib > min_gib:  # a finer grid where checkpointing spans less than ten of its steps (tiny models)
        step = min(step, 10.0 ** (math.floor(math.log10(baseline_gib - min_gib)) - 1))
    k_low = math.ceil(min_gib / step)
    while _on_grid(k_low, step) < min_gib:
        k_low += 1
    low, high = _on_grid(k_low, step), _on_grid(math.floor(top / step + 1e-9), step)
    if high <= low:
        return [low]
    mid = _on_grid(round((low + min(high, baseline_gib)) / 2 / step), step)
    return sorted({low, mid, high})


def _on_grid(k: int, step: float) -> float:
    """``k * step`` as its shortest decimal (74.8, not 74.80000000000001)."""
    digits = max(0, -math.floor(math.log10(step)))
    return float(f"{k * step:.{digits}f}")

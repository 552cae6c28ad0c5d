"""Step time and recompute as printed: on one basis, the ops' runtimes, with checkpointing's host overhead apart.

The stats time the step as the sum of its ops' runtimes (a roofline of the
kernels on the target's datasheet, or each op timed on its own with
``--benchmark``): no Python, no dispatch, no launch. A plan's ``recompute_ms``
adds to its recomputed ops' runtimes checkpointing's own host cost per
checkpointed module (``checkpoint_overhead_ms``: its forward code run again,
the policy called for every op; docs/memory-model.md, "Recompute time"). So a
share "of the step" compares the recomputed ops with the step's ops, and the
host overhead is given apart, in ms: on a small model, or where a plan
recomputes few ops, it is most of the recompute (it grows with the op
count, not with the FLOPs), which a percentage of a kernels-only step made
look alarming ("1048.6% of the step" for a tiny Llama).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.plan_format import Plan
from planner.stats.format import Stats

__all__ = ["RecomputeSplit", "recompute_split", "step_basis", "HOST_OVERHEAD_NOTE"]

HOST_OVERHEAD_NOTE = ("checkpointing's own work on the host (the forward code run again, the policy called per "
                      "op), outside the step's figure: it grows with the op count, not the FLOPs, so it outweighs "
                      "the recomputed kernels on a small model, or where a plan recomputes few ops")


@dataclass(frozen=True)
class RecomputeSplit:
    """A plan's recompute in two parts: the recomputed ops' runtimes and checkpointing's host overhead (ms)."""

    ops_ms: float
    overhead_ms: float
    step_ops_ms: float  # the step's forward + backward, ops alone: the basis of ``ops_share``

    @property
    def total_ms(self) -> float:
        return self.ops_ms + self.overhead_ms

    @property
    def ops_share(self) -> float | None:
        """The recomputed ops as a fraction of the step's ops (None: the stats give no step time)."""
        return self.ops_ms / self.step_ops_ms if self.step_ops_ms else None

    @property
    def overhead_dominates(self) -> bool:
        return self.overhead_ms > self.ops_ms

    def short_text(self) -> str:
        """``14.4 ms = ops 3.21 ms (63.6% of the step's ops) + host overhead 11.2 ms``: three figures or so."""
        share = "" if self.ops_share is None else f" ({self.ops_share:.1%} of the step's ops)"
        if not self.overhead_ms:
            return f"{_ms(self.total_ms)} ms of ops{share}"
        return f"{_ms(self.total_ms)} ms = ops {_ms(self.ops_ms)} ms{share} + host overhead {_ms(self.overhead_ms)} ms"

    def text(self, digits: int = 3) -> str:
        """``14.365 ms = ops 3.210 ms (63.6% of the step's 5.05 ms of ops) + host overhead 11.155 ms``."""
        share = "" if self.ops_share is None else (f" ({self.ops_share:.1%} of the step's "
                                                   f"{self.step_ops_ms:.{digits}f} ms of ops)")
        if not self.overhead_ms:
            return f"{self.total_ms:.{digits}f} ms of ops{share}"
        return (f"{self.total_ms:.{digits}f} ms = ops {self.ops_ms:.{digits}f} ms{share} + host overhead "
                f"{self.overhead_ms:.{digits}f} ms")


def _ms(ms: float) -> str:
    """About three significant figures, never fewer than one decimal: 346.7, 5.62, 0.022, 0."""
    if ms == 0:
        return "0"
    return f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}" if ms >= 0.1 else f"{ms:.2g}"


def recompute_split(stats: Stats, plan: Plan) -> RecomputeSplit | None:
    """The plan's recompute split into ops and host overhead (None: the plan has no recompute figure)."""
    if plan.recompute_ms is None:
        return None
    overhead = math.fsum(m.checkpoint_overhead_ms * stats.module(m.fqn).calls for m in plan.modules)
    ops = plan.recompute_ms - overhead
    if ops <= 1e-9 * max(plan.recompute_ms, 1.0):  # every op saved: the difference is rounding, not time
        ops = 0.0
    return RecomputeSplit(ops_ms=ops, overhead_ms=overhead, step_ops_ms=plan.compute_ms)


def step_basis(stats: Stats) -> str:
    """What the step's time is: the ops' runtimes alone, and how they were made."""
    how = {"roofline": "a roofline on the target's datasheet", "benchmark": "each op timed on its own"}
    source = how.get(stats.metadata.tags.get("cost_model", ""), "as the stats give them")
    return f"the ops' runtimes alone ({source}), no host overhead"

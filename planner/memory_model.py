"""The memory model: peak memory of a step for given per-module discards.

PyTorch's ``sac_milp`` model (see docs/memory-model.md): at each module n,

    m_n = TA_n + AG_n - sum(d_j for j finished before n in forward post-order)
          + (P + TG_n) / world_size  [+ optimizer state / world_size] [+ reserve]

and the step's peak is the largest m_n. ``d_j`` is the activation memory module
j discards when checkpointed: its autograd-saved bytes minus the bytes its
policy keeps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from planner.stats.format import Stats

__all__ = ["GIB", "MIB", "NEED_TOL_BYTES", "MemoryModel", "memory_model", "baseline_peak_bytes", "compute_ms"]

GIB = 2**30
MIB = 2**20
# Bytes are whole, but needs are floats (budget * 2**30, sharded terms / world_size):
# a plan meets a need when its discard falls short by at most float noise, never
# by a real fraction of a byte, so a plan's peak never exceeds its budget.
NEED_TOL_BYTES = 1e-6


@dataclass(frozen=True)
class MemoryModel:
    """Per-module constant memory and forward post-order positions."""

    fqns: tuple[str, ...]  # forward pre-order
    post_pos: np.ndarray  # position of each module in forward post-order
    base_bytes: np.ndarray  # m_n with no discards (float: sharding divides)

    def profile_bytes(self, discarded: Mapping[str, float] | None = None) -> np.ndarray:
        """m_n per module (pre-order) with ``discarded[fqn]`` bytes freed by each checkpointed module."""
        m = self.base_bytes.copy()
        for fqn, d in (discarded or {}).items():
            j = self.fqns.index(fqn)
            m[self.post_pos > self.post_pos[j]] -= d
        return m

    def peak_bytes(self, discarded: Mapping[str, float] | None = None) -> float:
        """Peak of m_n with ``discarded[fqn]`` bytes freed by each checkpointed module."""
        return float(self.profile_bytes(discarded).max())


def memory_model(
    stats: Stats, *, world_size: int = 1, include_optimizer_state: bool = False, reserve_bytes: float = 0.0
) -> MemoryModel:
    """Build the memory model of ``stats`` for ``world_size`` ranks."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    fqns = tuple(stats.fw_pre_order)
    post = {f: k for k, f in enumerate(stats.fw_post_order)}
    root = stats.root
    sharded_const = root.param_bytes + (root.optimizer_state_bytes if include_optimizer_state else 0)
    base = np.empty(len(fqns), dtype=np.float64)
    for i, f in enumerate(fqns):
        m = stats.module(f)
        base[i] = m.act_total_bytes + m.act_grad_bytes + (sharded_const + m.grad_total_bytes) / world_size
    base += reserve_bytes
    return MemoryModel(fqns, np.array([post[f] for f in fqns]), base)


def baseline_peak_bytes(stats: Stats, *, world_size: int = 1, include_optimizer_state: bool = False,
                        reserve_bytes: float = 0.0) -> int:
    """Peak memory with no checkpointing, rounded up to whole bytes."""
    model = memory_model(stats, world_size=world_size, include_optimizer_state=include_optimizer_state,
                         reserve_bytes=reserve_bytes)
    return int(np.ceil(model.peak_bytes()))


def compute_ms(stats: Stats) -> float:
    """Forward + backward time of the step, without recomputation."""
    return stats.root.fw_ms + stats.root.bw_ms

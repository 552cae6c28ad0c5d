"""The smallest peak any plan reaches: what ``min_feasible_budget_gib`` reports."""

from __future__ import annotations

import numpy as np

from planner.ops.frontier import max_discard_decision
from planner.solve.milp import solve_min_peak
from planner.solve.problem import Problem
from planner.solve.solution import Solution

__all__ = ["MIN_PEAK_MILP_SECONDS", "innermost_peak_bytes", "smallest_peak", "solve_min_peak_dp"]

# The least-peak MILP (modules called more than once) gets this long; past it its plan is an upper bound only.
MIN_PEAK_MILP_SECONDS = 60.0


def smallest_peak(prob: Problem) -> Solution:
    """The plan of least peak: the exact DP, or the MILP where the DP does not apply (a candidate called more
    than once whose stats describe every call); ``optimal`` when proven least."""
    if prob.repeat_counts():
        return solve_min_peak(prob, time_limit_s=MIN_PEAK_MILP_SECONDS)
    return solve_min_peak_dp(prob)


def innermost_peak_bytes(prob: Problem) -> float:
    """The peak, as the engines' needs count it, of one plan found without a search: every candidate with no
    candidate inside it checkpointed at its largest discard. No plan's peak is less than the least peak, so the
    least peak is at most this (within float noise: discards summed in another order).

    Candidates called more than once whose stats describe every call discard at every call: not counted here,
    so this is no bound for them (``Problem.repeat_counts``).
    """
    starts = prob.subtree_starts()
    innermost = [c.max_discard_bytes if starts[i] == i else 0 for i, c in enumerate(prob.candidates)]
    before = np.concatenate([[0], np.cumsum(np.asarray(innermost, dtype=np.int64))])  # per key: exact sums
    return float(np.max(prob.model.base_bytes - before[prob.node_key]))


def solve_min_peak_dp(prob: Problem) -> Solution:
    """The smallest peak any plan reaches, exactly.

    Recompute is ignored, and discarding more never raises any module's
    memory, so each checkpointed module only needs its largest-discard
    point. What remains is when to discard: a subtree either checkpoints its
    root (a big discard, late) or leaves it to its submodules (smaller,
    earlier). Non-dominated (discarded bytes, peak so far) states cover both.
    """
    # Only each candidate's largest discard matters, known from its op groups: no
    # frontier is needed (an infeasible budget is answered without building any).
    starts = prob.subtree_starts()
    m = len(prob.candidates)
    key_base = np.full(m + 1, -np.inf)
    np.maximum.at(key_base, prob.node_key, prob.model.base_bytes)
    best_d = [c.max_discard_bytes for c in prob.candidates]
    # a state: (discarded bytes, peak so far, chosen candidates as a tuple)
    def settle(states, k):
        states = [(s, max(p, key_base[k] - s), ch) for s, p, ch in states]
        states.sort(key=lambda x: (-x[0], x[1]))
        out, low = [], np.inf
        for s, p, ch in states:
            if p < low:
                out.append((s, p, ch))
                low = p
        return out

    def run(lo: int, hi: int, states):
        i = lo
        while i < hi:
            r = max(j for j in range(i, hi) if starts[j] == i)
            take = [(s + best_d[r], p, ch + (r,)) for s, p, ch in states] if best_d[r] > 0 else []
            if r == i:
                states = states + take
            else:
                below = run(i, r, states)
                skip = states
                for k in range(i + 1, r + 1):
                    skip = [(s, max(p, key_base[k] - s), ch) for s, p, ch in skip]
                take = [(s + best_d[r], p, ch + (r,)) for s, p, ch in skip] if best_d[r] > 0 else []
                states = below + take
            states = settle(states, r + 1)
            i = r + 1
        return states

    states = run(0, m, settle([(0, -np.inf, ())], 0))
    _, _, chosen = min(states, key=lambda x: x[1])
    decisions, by_ops = {}, {}
    for i in chosen:  # repeated layers share one decision
        m = prob.stats.module(prob.candidates[i].fqn)
        key = (prob.candidates[i].ops_key, tuple(op.runtime_ms for op in m.ops))  # the decision's ms are the raw ones
        if key not in by_ops:
            by_ops[key] = max_discard_decision(m.ops, m.force_store_random)
        decisions[m.fqn] = by_ops[key]
    return Solution.planned(prob, decisions, "optimal", "smallest peak (exact DP)", 0.0)

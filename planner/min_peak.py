"""The smallest peak any plan reaches: what ``min_feasible_budget_gib`` reports."""

from __future__ import annotations

import math

import numpy as np

from planner.milp import Problem, Solution
from planner.op_policy import max_discard_decision

__all__ = ["solve_min_peak_dp", "subtree_starts"]


def subtree_starts(prob: Problem) -> list[int]:
    """For each candidate (post-order index), the first candidate index of its subtree."""
    idx = {c.fqn: i for i, c in enumerate(prob.candidates)}
    start = list(range(len(prob.candidates)))
    for i, c in enumerate(prob.candidates):
        p = prob.stats.module(c.fqn).parent
        while p is not None:
            if p in idx:
                start[idx[p]] = min(start[idx[p]], start[i])
            p = prob.stats.module(p).parent
    return start


def solve_min_peak_dp(prob: Problem) -> Solution:
    """The smallest peak any plan reaches, exactly.

    Recompute is ignored, and discarding more never raises any module's
    memory, so each checkpointed module only needs its largest-discard
    point. What remains is when to discard: a subtree either checkpoints its
    root (a big discard, late) or leaves it to its submodules (smaller,
    earlier). Non-dominated (discarded bytes, peak so far) states cover both.
    """
    if prob._min_peak is not None:
        return prob._min_peak
    # Only each candidate's largest discard matters, known from its op groups: no
    # frontier is needed (an infeasible budget is answered without building any).
    starts = subtree_starts(prob)
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
    decisions = {}
    for i in chosen:
        m = prob.stats.module(prob.candidates[i].fqn)
        decisions[m.fqn] = max_discard_decision(m.ops, m.force_store_random)
    discarded = {f: prob.stats.module(f).act_saved_bytes - sb for f, (_, sb, _) in decisions.items()}
    peak = prob.model.peak_bytes(discarded)
    recompute = math.fsum(prob.stats.module(f).op_ms - sm for f, (_, _, sm) in decisions.items())
    prob._min_peak = Solution("optimal", "smallest peak (exact DP)", peak, recompute, 0.0, 0.0, decisions)
    return prob._min_peak

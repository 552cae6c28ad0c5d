"""Offload on stacks of identical blocks: the relaxation's points, its bound and its plans, against brute force,
the MILP and the issue's rules (``offload_helpers.evaluate`` re-derives every plan from the raw stats)."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
from offload_helpers import evaluate, finish_stack
from offload_toy import toy_doc

from planner import GIB, Stats, min_feasible_budget_gib, plan
from planner.solve.offload import host_link, offload_setup
from planner.solve.problem import prepare
from planner.solve.stack.offload_items import Stall, offload_points
from planner.solve.stack.offload_stack import offload_stack, solve_offload_stack


def _front(v, cost):
    """(v, cost) pairs no other beats on more v for no more cost."""
    out, best = [], math.inf
    for x, c in sorted(zip(v, cost), key=lambda p: (-p[0], p[1])):
        if c < best - 1e-12:
            out.append((x, round(c, 9)))
            best = c
    return sorted(out)


def test_offload_points_equal_brute_force_over_every_count():
    rng = np.random.default_rng(31)
    for _ in range(150):
        n = int(rng.integers(1, 5))
        w = rng.integers(1, 6, n) * 100
        r = rng.random(n) * rng.choice([0.1, 1.0, 3.0])
        mult = rng.integers(1, 3, n)
        able = np.array([rng.integers(0, m + 1) for m in mult])
        stall = Stall(1 / 100, float(rng.random() * 3), 1 / 150, float(rng.random() * 5))
        least = int(rng.choice([0, 0, 100, 300, 600]))
        v, cost = [], []
        per_class = [[(a, b) for a in range(m + 1) for b in range(min(m - a, t) + 1)] for m, t in zip(mult, able)]
        for choice in itertools.product(*per_class):  # every (recomputed, offloaded) count of every class
            k, f = np.array([c[0] for c in choice]), np.array([c[1] for c in choice])
            if w @ k >= least:
                v.append(int(w @ (k + f)))
                cost.append(float(r @ k) + float(stall(w @ f)))
        pts = offload_points(w, r, mult, able, stall, least_early=least)
        assert _front(pts.v.tolist(), pts.cost.tolist()) == _front(v, cost)
        # each point's counts give its figures, and fit its classes
        assert np.array_equal(pts.k @ w + pts.f @ w, pts.v) and np.array_equal(pts.f @ w, pts.o)
        assert np.allclose(pts.k @ r, pts.ms) and np.all(pts.k + pts.f <= mult) and np.all(pts.f <= able)


def _ops(rng, n):
    return [dict(name=f"aten.op{i}", runtime_ms=round(rng.uniform(0.05, 3), 3),
                 output_bytes=rng.choice([64, 128, 256, 512, 1024])) for i in range(n)]


def identical_stack(rng, blocks: int) -> Stats:
    """R: R.emb, R.L with ``blocks`` identical blocks R.L.j (ops, and a child R.L.j.a with ops), R.head; each block
    adds the same memory to the timeline (the needs grow alike), as in a real decoder."""
    block_ops, child_ops = _ops(rng, 3), _ops(rng, 2)
    held = rng.choice([0, 64])
    fw, bw = round(rng.uniform(0.5, 2), 3), round(rng.uniform(1, 4), 3)
    mods = [dict(fqn="R", parent=None, is_leaf=False), dict(fqn="R.emb", parent="R", is_leaf=True, fw_ms=0.3,
                                                              bw_ms=0.5), dict(fqn="R.L", parent="R", is_leaf=False)]
    pre, post = ["R", "R.emb", "R.L"], ["R.emb"]
    for j in range(blocks):
        b = f"R.L.{j}"
        mods += [dict(fqn=b, parent="R.L", is_leaf=False, ops=block_ops, fw_ms=fw, bw_ms=bw, held_input_bytes=held,
                      act_saved_bytes=sum(op["output_bytes"] for op in block_ops) + held),
                 dict(fqn=b + ".a", parent=b, is_leaf=False, ops=child_ops,
                      act_saved_bytes=sum(op["output_bytes"] for op in child_ops)),
                 dict(fqn=b + ".a.x", parent=b + ".a", is_leaf=True)]
        pre += [b, b + ".a", b + ".a.x"]
        post += [b + ".a.x", b + ".a", b]
    return finish_stack(mods, pre, post, blocks=blocks, fw=fw, bw=bw, keys=3, per_key=1200, name="identical-stack")


@pytest.mark.parametrize("seed", [0, 1, 3])
def test_stack_bound_and_plans_against_the_milp(seed):
    rng = random.Random(seed)
    proven = compared = offloading = 0
    for blocks, gbps in ((8, 3e-4), (12, 1e-4), (10, 1.0)):
        stats = identical_stack(rng, blocks)
        prob = prepare(stats)
        setup = offload_setup(prob, host_link(stats, gbps))
        model = offload_stack(prob, setup.windows, setup.options)
        assert model.stack is not None and len(model.stack.blocks) >= blocks - 2
        least = min_feasible_budget_gib(stats)
        top = plan(stats, 1e6).baseline_peak_bytes / GIB
        for frac in (0.05, 0.4, 0.8):  # tight to loose
            budget = least + (top - least) * frac
            milp = plan(stats, budget, offload="on", host_link_gbps=gbps, solver="milp", mip_rel_gap=1e-9)
            assert milp.status == "optimal", milp.message
            best = milp.step_overhead_ms
            res = solve_offload_stack(prob, model, budget * GIB)
            assert res is not None
            assert res.lower <= best + 1e-6 * best + 1e-9, (seed, blocks, frac)  # a lower bound
            compared += 1
            if res.plan is None:
                continue
            mods = [(f, d[0], res.plan.offload.modules.get(f)) for f, d in res.plan.decisions.items()]
            peak, rc, stall = evaluate(stats, mods, gbps)  # the plan on the rules
            assert peak <= budget * GIB + 1e-6
            assert rc + stall == pytest.approx(res.plan.overhead_ms, abs=1e-9)
            assert rc + stall >= best - 1e-6 * best - 1e-9
            if res.plan.status == "optimal":
                assert rc + stall == pytest.approx(best, rel=1e-6, abs=1e-9), (seed, blocks, frac)
                proven += 1
                offloading += res.plan.offload.host_bytes > 0
    # (on this code every budget of seeds 0, 1 and 3 is proven)
    assert proven >= compared // 2 and offloading >= 3, (proven, compared, offloading)


def test_a_window_whose_credit_helps_no_moment_offloads_nothing():
    """offload_toy: the last block R.layers.2's offload is credited from key 10 (post(R) + 1) on. There the toy
    holds 11_000 (forward) and 21_000 bytes (backward) of activations, above every moment before (the most:
    20_900, backward at key 9), so its offload may matter. With the key-10 backward moment at 20_800 instead,
    every moment it credits is implied by the one at key 9 (nothing credited then is taken back by key 10):
    the block gets no offload points (dropping them loses no plan: its offload would only add stall)."""
    def last_block_offloads(doc) -> bool:
        stats = Stats.model_validate(doc)
        prob = prepare(stats)
        setup = offload_setup(prob, host_link(stats, 1e-3))
        last = next(i for i, c in enumerate(prob.candidates) if c.fqn == "R.layers.2")
        assert last in setup.options  # offcore's rules let it offload
        return last in offload_stack(prob, setup.windows, setup.options).points

    doc = toy_doc()
    assert last_block_offloads(doc)
    for moment in doc["timeline"]:
        if moment["phase"] == "backward" and moment["key"] == 10:
            moment["activation_bytes"] = 20_800
    assert not last_block_offloads(doc)

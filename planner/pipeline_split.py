"""A balanced pipeline split: the split points and the checkpointing they need, chosen together under one budget.

From one collection of the whole model (its stages under an equal split: every decoder layer's figures, and
what each stage position adds beyond its layers), each candidate stage (a run of layers at a position) is
estimated: its microbatch time (its layers' forward + backward, the position's embedding or head), its peak
without checkpointing (parameters, gradients and optimizer state per parameter byte as the equal stage at the
position has them; the microbatches in flight at the position times what one microbatch holds; the rest of the
equal stage's peak as it is), and the recompute that brings it under the budget (each layer's op-level frontier,
its lower convex hull taken cheapest slope first across the stage's layers, every microbatch in flight
discarding). A dynamic program over the split points keeps, per stage and last layer, every (slowest stage,
sum over stages) pair not beaten on both, and the split with the least predicted step wins (see
:func:`planner.pipeline_step_ms`). The figures are estimates: collect the chosen split and plan it exactly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.memory_model import GIB, baseline_peak_bytes, compute_ms, discardable_bytes
from planner.pipeline_planning import PipelinePlan, pipeline_step_ms, plan_pipeline
from planner.pipeline_schedule import in_flight
from planner.stats.format import Stats

__all__ = ["SplitChoice", "best_split", "choose_pipeline_split"]

_LAYER = re.compile(r"\.layers\.(\d+)$")


@dataclass(frozen=True)
class SplitChoice:
    """The split chosen (``split``: where stages 1.. start, ``model.layers.N``) and its estimated figures."""

    split: list[str]
    layers: list[list[int]]
    stage_ms: list[float]
    step_ms: float
    equal_step_ms: float | None  # the equal split's step under the same estimate (None: it does not fit)


def choose_pipeline_split(stats: Sequence[Stats], memory_budget_gib: float, *, world_size: int = 1,
                          equal_plan: PipelinePlan | None = None, time_limit_s: float = 60.0) -> SplitChoice:
    """The split of the decoder's layers over the pipeline's stages with the least estimated step under the budget.

    ``stats``: every stage of one collection (GPipe or 1F1B), in stage order. Its exact per-stage plans
    (``equal_plan``, or :func:`plan_pipeline` under the budget) calibrate the recompute a layer needs for the share
    of its activations it must discard. ValueError when no split fits the budget under the estimate.
    """
    info = stats[0].metadata.pipeline
    if info is None or info.virtual_stages != 1:
        raise ValueError("choose_pipeline_split takes the stages of a gpipe or 1f1b collection (one chunk per rank), "
                         f"got {'no pipeline' if info is None else info.schedule}")
    n_stages, m = info.stages, info.microbatches
    layer_mod, layer_pos = {}, {}
    for k, s in enumerate(stats):
        for mod in s.modules:
            if (g := _LAYER.search(mod.fqn)) and mod.parent is not None:
                layer_mod[int(g.group(1))], layer_pos[int(g.group(1))] = mod, k
    n_layers = len(layer_mod)
    t = np.array([layer_mod[i].fw_ms + layer_mod[i].bw_ms for i in range(n_layers)])
    p = np.array([float(layer_mod[i].param_bytes) for i in range(n_layers)])
    h = np.array([float(layer_mod[i].act_saved_bytes + layer_mod[i].output_bytes) for i in range(n_layers)])
    ct, cp, ch = (np.concatenate([[0.0], np.cumsum(x)]) for x in (t, p, h))
    disc = float(discardable_bytes(layer_mod[n_layers // 2]))
    budget = memory_budget_gib * GIB
    pos = []  # per position: (fixed ms, fixed held, static bytes per param byte, rest of the peak, in flight)
    for k, s in enumerate(stats):
        mine = [i for i in range(n_layers) if layer_pos[i] == k]
        pi = s.metadata.pipeline
        n = in_flight(pi.schedule, k, n_stages, m)
        static = (s.root.param_bytes * 2 + s.root.optimizer_state_bytes) / world_size
        held = pi.held_bytes - float(h[mine].sum())
        rest = baseline_peak_bytes(s, world_size=world_size) - static - n * pi.held_bytes
        pos.append((compute_ms(s) - float(t[mine].sum()), held, static / max(s.root.param_bytes, 1),
                    rest + static - static / max(s.root.param_bytes, 1) * float(p[mine].sum()), n))

    def need(k: int, a: int, b: int) -> float:
        """What each layer must discard per microbatch, as a share of what it can."""
        _, held, per_param, rest, n = pos[k]
        peak = rest + per_param * (cp[b] - cp[a]) + n * (held + ch[b] - ch[a])
        return max(0.0, (peak - budget) / n) / ((b - a) * disc)

    curve = _recompute_curve(stats, memory_budget_gib, world_size, equal_plan, need, layer_pos, layer_mod)

    def stage_ms(k: int, a: int, b: int) -> float | None:
        x = need(k, a, b)
        return None if x > 1 else pos[k][0] + ct[b] - ct[a] + (b - a) * float(np.interp(x, *curve))

    best = best_split(stage_ms, n_stages, n_layers, m)
    if best is None:
        raise ValueError(f"no split of {n_layers} layers over {n_stages} stages fits {memory_budget_gib:g} GiB "
                         f"under the estimate")
    starts, times = best
    bounds = list(starts) + [n_layers]
    equal = [stage_ms(k, a, b) for k, (a, b) in enumerate(zip(*_equal_bounds(n_layers, n_stages)))]
    return SplitChoice(split=[f"model.layers.{a}" for a in starts[1:]],
                       layers=[list(range(a, b)) for a, b in zip(bounds, bounds[1:])], stage_ms=times,
                       step_ms=pipeline_step_ms(times, m),
                       equal_step_ms=None if None in equal else pipeline_step_ms(equal, m))


def _recompute_curve(stats: Sequence[Stats], budget_gib: float, world_size: int, equal_plan: PipelinePlan | None,
                     need: Callable[[int, int, int], float], layer_pos: dict[int, int],
                     layer_mod: dict[int, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(share of a layer's discardable bytes, recompute ms per layer and microbatch), through each stage of the
    collected split's exact plan: no discard costs nothing, discarding everything costs the layer's forward."""
    pp = equal_plan or plan_pipeline(stats, budget_gib, world_size=world_size, time_limit_s=60.0)
    points = {0.0: 0.0}
    for k, plan in enumerate(pp.stages):
        mine = [i for i in layer_pos if layer_pos[i] == k]
        if plan.recompute_ms is None or not mine:
            continue
        x = need(k, min(mine), max(mine) + 1)
        if 0 < x <= 1:
            points[x] = max(points.get(x, 0.0), plan.recompute_ms / len(mine))
    mid = layer_mod[len(layer_mod) // 2]
    points[1.0] = max(points.get(1.0, 0.0), mid.fw_ms)
    xs = sorted(points)
    ys = np.maximum.accumulate([points[x] for x in xs])
    return np.array(xs), ys


def _equal_bounds(n_layers: int, n_stages: int) -> tuple[list[int], list[int]]:
    base, extra = divmod(n_layers, n_stages)
    sizes = [base + (1 if k < extra else 0) for k in range(n_stages)]
    starts = [sum(sizes[:k]) for k in range(n_stages)]
    return starts, [a + n for a, n in zip(starts, sizes)]


def best_split(stage_ms: Callable[[int, int, int], float | None], n_stages: int, n_layers: int,
               m: int) -> tuple[list[int], list[float]] | None:
    """The split of ``n_layers`` layers over ``n_stages`` stages (each at least one) with the least
    :func:`pipeline_step_ms` over ``m`` microbatches, given ``stage_ms(stage, first, end)`` (None: does not fit):
    (each stage's first layer, each stage's ms), or None. Stage by stage, per last layer, every (slowest, sum)
    pair not beaten on both is kept: the step M x slowest + (sum - slowest) is least at one of them."""
    front: dict[int, list[tuple[float, float, tuple[int, ...], tuple[float, ...]]]] = {0: [(0.0, 0.0, (), ())]}
    for k in range(n_stages):
        nxt: dict[int, list] = {}
        last = k == n_stages - 1
        for a, entries in front.items():
            for b in ([n_layers] if last else range(a + 1, n_layers - (n_stages - 1 - k) + 1)):
                ms = stage_ms(k, a, b)
                if ms is None:
                    continue
                for slow, total, starts, times in entries:
                    nxt.setdefault(b, []).append((max(slow, ms), total + ms, starts + (a,), times + (ms,)))
        front = {b: _non_dominated(v) for b, v in nxt.items()}
    done = front.get(n_layers)
    if not done:
        return None
    slow, total, starts, times = min(done, key=lambda e: m * e[0] + (e[1] - e[0]))
    return list(starts), list(times)


def _non_dominated(entries: list) -> list:
    entries.sort(key=lambda e: (e[0], e[1]))
    out, best_total = [], float("inf")
    for e in entries:
        if e[1] < best_total:
            out.append(e)
            best_total = e[1]
    return out

"""Charts of plans that offload: what is on the host when, per window what is kept, recomputed and offloaded,
and the sweep's two curves (with and without offloading).

Drawn as SVG with text kept as text (as tests/service/views/test_charts.py). The stats: the API docs' example
(two layers, a timeline), whose offload windows are its two layers and the rest (docs/memory-model.md,
"Offloading").
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import planner
from service.examples import EXAMPLE_STATS
from service.views import plan_chart, sweep_chart
from service.views.memory_kinds import step_memory
from service.views.offload_chart import window_bytes

LINK_GBPS = 24.0


@pytest.fixture(scope="module")
def stats():
    return planner.parse_stats(EXAMPLE_STATS)


def _hand_offload_plan(stats, budget_gib: float = 0.75) -> dict:
    """HAND-MADE, for rendering only: a real plan at ``budget_gib`` (layers.0 checkpointed, every op recomputed)
    with the fields a plan that offloads carries added by hand: layers.0 saves its first matmul's output (op 2,
    128 MiB) and offloads it. The numbers follow the stall formula of docs/memory-model.md at 24 GB/s."""
    plan = planner.plan(stats, budget_gib).model_dump(mode="json")
    (m,) = plan["modules"]
    assert m["fqn"] == "Net.layers.0"
    layer = stats.module("Net.layers.0")
    out = layer.ops[2].output_bytes
    m["save"] = [int(i == 2) for i in range(len(layer.ops))]
    m["offload"] = [int(i == 2) for i in range(len(layer.ops))]
    m["saved_bytes"], m["offloaded_bytes"] = out, out
    m["discarded_bytes"] = layer.act_saved_bytes - out
    nxt = stats.module("Net.layers.1")
    copy_ms = out / (LINK_GBPS * 1e9) * 1e3
    windows = [
        {"index": 0, "end_module": "Net.layers.0", "offloaded_bytes": out, "d2h_ms": copy_ms, "forward_ms": nxt.fw_ms,
         "h2d_ms": copy_ms, "backward_ms": nxt.bw_ms, "stall_ms": 0.0},
        {"index": 1, "end_module": "Net.layers.1", "offloaded_bytes": 0, "d2h_ms": 0.0, "forward_ms": 0.0,
         "h2d_ms": 0.0, "backward_ms": 0.0, "stall_ms": 0.0},
        {"index": 2, "end_module": "", "offloaded_bytes": 0, "d2h_ms": 0.0, "forward_ms": 0.0,
         "h2d_ms": 0.0, "backward_ms": 0.0, "stall_ms": 0.0},
    ]
    plan.update(offload="on", host_link_gbps={"d2h": LINK_GBPS, "h2d": LINK_GBPS}, host_bytes=out,
                offload_stall_ms=0.0, step_overhead_ms=plan["recompute_ms"], offload_windows=windows,
                prefetch_distance=1)
    return plan


def test_the_host_holds_window_1s_offload_from_the_end_of_window_2_on(stats):
    plan = _hand_offload_plan(stats)
    memory = step_memory(stats, plan)
    model = planner.memory_model(stats)
    # docs/memory-model.md: the first window's bytes are off the device at keys >= B_2 = post(layers.1) + 1 = 8
    credited = model.keys >= stats.fw_post_order.index("Net.layers.1") + 1
    assert credited.any() and (~credited).any()
    np.testing.assert_array_equal(memory.host, np.where(credited, plan["host_bytes"], 0.0))
    without = step_memory(stats, {k: v for k, v in plan.items() if k != "offload_windows"})
    np.testing.assert_allclose(without.planned["activations"] - memory.planned["activations"], memory.host)


def test_the_plan_chart_shows_the_host_and_the_windows(stats):
    plan = _hand_offload_plan(stats)
    svg = plan_chart(stats, plan, image_format="svg").decode()
    assert "offloaded: on the host, off the device (at most 128 MiB)" in svg  # host_bytes: 134217728 = 128 MiB
    assert "offloaded 0.125 GiB pinned host memory at 24/24 GB/s, stall 0 ms" in svg  # the title
    for label in ("0: to layers.0", "1: to layers.1", "2: to rest", "kept on the device",
                  "discarded, recomputed in backward", "offloaded to host memory", "128 MiB off"):
        assert label in svg, label
    parts = window_bytes(plan, {f: k for k, f in enumerate(stats.fw_post_order)}, "Net")
    (m,) = plan["modules"]  # window 0 holds layers.0, the plan's one checkpointed module
    assert parts["offloaded to host memory"].tolist() == [m["offloaded_bytes"], 0, 0]
    assert parts["kept on the device"].tolist() == [m["saved_bytes"] - m["offloaded_bytes"], 0, 0]
    assert parts["discarded, recomputed in backward"].tolist() == [m["discarded_bytes"], 0, 0]


def test_a_stalling_window_says_so(stats):
    plan = _hand_offload_plan(stats)
    plan["offload_windows"][0]["stall_ms"] = 1.25
    svg = plan_chart(stats, plan, image_format="svg").decode()
    assert "stall 1.25 ms" in svg


def test_a_plan_without_offloading_draws_no_host(stats):
    svg = plan_chart(stats, planner.plan(stats, 0.75).model_dump(mode="json"), image_format="svg").decode()
    assert "on the host" not in svg and "offload window" not in svg and "pinned" not in svg


def test_the_sweep_draws_both_curves(stats):
    on = [_hand_offload_plan(stats, b) for b in (0.75, 0.8)]
    for p, stall in zip(on, (0.5, 0.0)):  # hand-made stalls, so the two curves differ
        p["offload_stall_ms"] = stall
        p["step_overhead_ms"] = p["recompute_ms"] + stall
    off = [planner.plan(stats, b).model_dump(mode="json") for b in (0.75, 0.8)]
    svg = sweep_chart("Net", on, planner.baseline_peak_bytes(stats), image_format="svg",
                      without_offload=off).decode()
    for label in ("with offloading: recompute + copy stall", "with offloading: of which recompute",
                  "without offloading: recompute", "step-time overhead against memory budget, with and without "
                  "offloading"):
        assert label in svg, label
    plain = sweep_chart("Net", copy.deepcopy(off), planner.baseline_peak_bytes(stats), image_format="svg").decode()
    assert "offloading" not in plain and "recompute time against memory budget" in plain

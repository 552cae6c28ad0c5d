"""Charts of plans that offload: what is on the host when, per window what is kept, recomputed and offloaded,
and the sweep's two curves (with and without offloading).

Drawn as SVG with text kept as text (as tests/service/views/test_charts.py), from real plans of
``tests/data/mlp6_a100.json`` (the API docs' example MLP with six layers, collected for an A100-80GB:
``make_mlp6_stats.py``), whose offload windows are its six layers and the rest (docs/memory-model.md,
"Offloading"). At 16 GB/s the plan at 1.5 GiB stalls in four windows; at the table's 24 GB/s it does not.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import planner
from service.views import plan_chart, sweep_chart
from service.views.memory_kinds import step_memory
from service.views.offload_chart import window_bytes

STATS = Path(__file__).resolve().parents[2] / "data" / "mlp6_a100.json"


@pytest.fixture(scope="module")
def stats():
    return planner.load_stats(STATS)


@pytest.fixture(scope="module")
def stalling(stats):
    plan = planner.plan(stats, 1.5, offload="on", host_link_gbps=16).model_dump(mode="json")
    assert plan["status"] == "optimal" and plan["host_bytes"] > 0 and plan["offload_stall_ms"] > 0
    return plan


def _svg(stats, plan) -> str:
    return plan_chart(stats, plan, image_format="svg").decode()


def test_the_host_holds_each_windows_offload_from_the_end_of_the_next_window_on(stats, stalling):
    memory = step_memory(stats, stalling)
    model = planner.memory_model(stats)
    # docs/memory-model.md: window j's bytes are off the device at keys >= B_{j+1} = post(window j+1's end) + 1
    windows = stalling["offload_windows"]
    expected = np.zeros(len(model.keys))
    for w, after in zip(windows, windows[1:]):
        expected += w["offloaded_bytes"] * (model.keys >= stats.fw_post_order.index(after["end_module"] or "Net") + 1)
    assert expected.max() > 0
    np.testing.assert_array_equal(memory.host, expected)
    assert memory.host.max() <= stalling["host_bytes"] == sum(w["offloaded_bytes"] for w in windows)
    # The kinds, the offload credit taken off the activations, add up to the planner's own timeline.
    np.testing.assert_allclose(memory.total(memory.planned), [t["planned_bytes"] for t in stalling["timeline"]],
                               atol=1)
    assert memory.planned["activations"].min() >= 0


def test_the_plan_chart_shows_the_host_the_windows_and_their_stall(stats, stalling):
    svg = _svg(stats, stalling)
    host_most = step_memory(stats, stalling).host.max()
    # in GiB, the unit of the memory axes (the step peaks at 2.39 GiB without checkpointing)
    assert f"offloaded: on the host, off the device (at most {host_most / 2**30:.4g} GiB)" in svg
    assert (f"offloaded {stalling['host_bytes'] / 2**30:.3g} GiB pinned host memory at 16/16 GB/s, "
            f"stall {stalling['offload_stall_ms']:.3g} ms") in svg  # the title
    for k in range(6):
        assert f"{k}: to layers.{k}" in svg
    assert "6: to rest" in svg
    for kind in ("kept on the device", "discarded, recomputed in backward", "offloaded to host memory"):
        assert kind in svg
    for w in stalling["offload_windows"]:  # each stalling window says by how much
        if w["stall_ms"] > 0:
            assert f"stall {w['stall_ms']:.3g} ms" in svg
    parts = window_bytes(stalling, {f: k for k, f in enumerate(stats.fw_post_order)}, "Net")
    np.testing.assert_array_equal(parts["offloaded to host memory"],
                                  [w["offloaded_bytes"] for w in stalling["offload_windows"]])
    modules = stalling["modules"]
    assert parts["discarded, recomputed in backward"].sum() == sum(m["discarded_bytes"] for m in modules)
    assert parts["kept on the device"].sum() == sum(m["saved_bytes"] - (m.get("offloaded_bytes") or 0)
                                                    for m in modules)


def test_a_plan_without_offloading_draws_no_host(stats):
    svg = _svg(stats, planner.plan(stats, 1.5).model_dump(mode="json"))
    assert "on the host" not in svg and "offload window" not in svg and "pinned" not in svg


def test_the_sweep_draws_both_curves(stats):
    budgets = [1.3, 1.5, 1.7]
    on = [p.model_dump(mode="json") for p in planner.sweep(stats, budgets, offload="on", host_link_gbps=16)]
    off = [p.model_dump(mode="json") for p in planner.sweep(stats, budgets)]
    assert any(p["offload_stall_ms"] > 0 for p in on)
    svg = sweep_chart("Net", on, planner.baseline_peak_bytes(stats), image_format="svg", without_offload=off).decode()
    for label in ("with offloading: recompute + copy stall", "with offloading: of which recompute",
                  "without offloading: recompute", "step-time overhead against memory budget, with and without "
                  "offloading"):
        assert label in svg, label
    plain = sweep_chart("Net", off, planner.baseline_peak_bytes(stats), image_format="svg").decode()
    assert "offloading" not in plain and "recompute time against memory budget" in plain

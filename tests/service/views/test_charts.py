"""Plan and sweep charts say what a person looks for: where in the step, what the memory is, the budgets.

Drawn as SVG with text kept as text, so each property is a word or a number in
the file (no pixel comparisons). The stats: the API docs' example, collected
by the collector (a timeline, every phase), and the tests' hand-written
two-layer document (no timeline: PyTorch's per-module model).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from two_layer_stats import TWO_LAYER_STATS

import planner
from service.examples import EXAMPLE_STATS
from service.views import plan_chart, sweep_chart
from service.views.memory_kinds import step_memory


def _svg(stats, plan) -> str:
    return plan_chart(stats, plan.model_dump(mode="json"), image_format="svg").decode()


@pytest.fixture(scope="module")
def collected():
    return planner.parse_stats(EXAMPLE_STATS)


def test_module_names_label_the_axis_and_the_phases_are_named(collected):
    svg = _svg(collected, planner.plan(collected, 0.75))
    for name in ("layers.0.up", "layers.1.down"):  # the root's own name taken off
        assert f">{name}<" in svg
    for phase in ("forward", "backward", "optimizer step"):
        assert phase in svg
    assert "(step model)" not in svg and "(torch model)" not in svg
    assert "Net, budget 0.75 GiB: 1 module checkpointed" in svg


def test_memory_is_stacked_by_kind_without_and_with_the_plan(collected):
    plan = planner.plan(collected, 0.75)
    svg = _svg(collected, plan)
    for kind in ("parameters", "gradients", "optimizer state", "activations", "without checkpointing",
                 "with the plan"):
        assert kind in svg
    memory = step_memory(collected, plan.model_dump(mode="json"))
    assert ("held inputs" in svg) == (memory.planned["held inputs"].max() > 0)  # a band only where there are some
    # The kinds add up to the plan's own timeline (ceil: whole bytes), without and with the plan.
    np.testing.assert_allclose(memory.total(memory.baseline), [t.baseline_bytes for t in plan.timeline], atol=1)
    np.testing.assert_allclose(memory.total(memory.planned), [t.planned_bytes for t in plan.timeline], atol=1)
    assert memory.planned["activations"].min() >= 0


def test_an_infeasible_chart_draws_the_smallest_budget_with_a_plan(collected):
    smallest = planner.min_feasible_budget_gib(collected)
    plan = planner.plan(collected, 0.5)
    assert plan.status == "infeasible"
    svg = _svg(collected, plan)
    assert f"smallest budget with a plan: {smallest:.6g} GiB" in svg and "no plan fits" in svg
    assert "with the plan" not in svg  # no plan, no second panel


def test_per_module_model_charts_name_modules_and_thin_them():
    stats = planner.parse_stats(TWO_LAYER_STATS)
    svg = _svg(stats, planner.plan(stats, 4.5))
    assert ">layers.0.fc<" in svg and "per-module model" in svg
    deep = planner.load_stats("tests/data/torch_format_transformer_L12.json")
    labels = re.findall(r">(layers\.\d+[^<]*)<", _svg(deep, planner.plan(deep, 8)))
    assert 10 < len(labels) < len(deep.fw_post_order)  # thinned to fit, and still many


def test_gradient_accumulation_marks_the_micro_batches(collected):
    doc = collected.model_dump(mode="json")
    forward_backward = [t for t in doc["timeline"] if t["phase"] != "optimizer"]
    doc["metadata"]["grad_accumulation"] = 2  # the same micro-batch twice, the second holding its gradients
    doc["timeline"] = ([{**t, "micro_batch": 1} for t in forward_backward]
                       + [{**t, "micro_batch": 2} for t in forward_backward]
                       + [t for t in doc["timeline"] if t["phase"] == "optimizer"])
    stats = planner.parse_stats(doc)
    svg = _svg(stats, planner.plan(stats, 1.0))
    assert "micro-batch 2" in svg or "forward 2" in svg


def test_the_sweep_chart_names_its_budgets(collected):
    plans = [p.model_dump(mode="json") for p in planner.sweep(collected, [0.5, 0.75, 0.9])]
    svg = sweep_chart("Net", plans, planner.baseline_peak_bytes(collected), image_format="svg").decode()
    assert "smallest budget with a plan" in svg and "no plan at this budget" in svg
    assert "Net: recompute time against memory budget" in svg

"""apply_plan: op matching by position and name, clear errors, plan validation."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from estimators import PlanMismatchError, apply_plan  # noqa: E402
from planner import optimal_op_policy  # noqa: E402


def _plan(stats, fqn, budget=0.5):
    ops = stats.module(fqn).ops
    return {"status": "optimal", "modules": [{"fqn": fqn, "discard_ratio": 0.5, "discarded_bytes": 0,
                                              "saved_bytes": 0, "recompute_ms": 0.0,
                                              "save": optimal_op_policy(ops, budget)}]}


def test_different_op_sequence_names_module_and_first_mismatching_op(transformer_case):
    stats = transformer_case.stats
    fqn = "Transformer.layers.1"
    model = transformer_case.fresh_copy()
    model.layers[1].feed_forward.gelu = torch.nn.SiLU()  # one op differs: gelu -> silu
    k = [op.name for op in stats.module(fqn).ops].index("aten.gelu")
    apply_plan(model, _plan(stats, fqn), stats=stats)
    with pytest.raises(PlanMismatchError, match=rf"module 'Transformer\.layers\.1': op {k} is aten\.silu but "
                                                rf"the plan's stats have aten\.gelu"):
        transformer_case.call(model)


def test_fewer_ops_than_planned_is_an_error(transformer_case):
    stats = transformer_case.stats
    fqn = "Transformer.layers.0"
    plan = _plan(stats, fqn)
    plan["modules"][0]["save"] = plan["modules"][0]["save"] + [0]
    with pytest.raises(PlanMismatchError, match="plan has 76 save decisions but the stats list 75 ops"):
        apply_plan(transformer_case.fresh_copy(), plan, stats=stats)
    model = apply_plan(transformer_case.fresh_copy(), plan)  # no stats: the count is checked when it runs
    with pytest.raises(PlanMismatchError, match="'Transformer.layers.0': ran 75 ops but the plan was made for 76"):
        transformer_case.call(model)


def test_unknown_module_and_unusable_status(transformer_case):
    plan = _plan(transformer_case.stats, "Transformer.layers.0")
    plan["modules"][0]["fqn"] = "Transformer.layers.7"
    with pytest.raises(ValueError, match=r"modules\[0\]\.fqn 'Transformer\.layers\.7' is not a module of Transformer"):
        apply_plan(transformer_case.fresh_copy(), plan)
    with pytest.raises(ValueError, match="plan status is 'infeasible'"):
        apply_plan(transformer_case.fresh_copy(), {"status": "infeasible", "modules": []})


def test_split_random_decisions_are_refused(transformer_case):
    stats = transformer_case.stats
    fqn = "Transformer.layers.0"
    ops = stats.module(fqn).ops
    rand = [i for i, op in enumerate(ops) if op.random]
    assert len(rand) >= 2  # dropout on: three dropouts per layer
    save = [0] * len(ops)
    save[rand[0]] = 1  # first random op saved, the others recomputed
    plan = {"status": "optimal", "modules": [{"fqn": fqn, "discard_ratio": 1.0, "discarded_bytes": 0,
                                              "saved_bytes": 0, "recompute_ms": 0.0, "save": save}]}
    with pytest.raises(PlanMismatchError, match="random ops must all be saved or all recomputed"):
        apply_plan(transformer_case.fresh_copy(), plan, stats=stats)  # at once, before any step


def test_accepts_planner_plan_model(transformer_case):
    from planner import Plan

    doc = _plan(transformer_case.stats, "Transformer.layers.0")
    plan = Plan.model_validate({**doc, "memory_budget_gib": 1.0, "baseline_peak_bytes": 1, "compute_ms": 1.0,
                                "planner_version": "test"})
    model = apply_plan(transformer_case.fresh_copy(), plan, stats=transformer_case.stats)
    transformer_case.call(model).sum().backward()


def test_planner_plan_alone_verifies_op_names(transformer_case):
    """A plan from planner.plan carries op names, so apply_plan needs no stats to catch a changed model."""
    import planner

    # This tiny model's steady-state peak is its optimizer step, which no plan lowers: plan its first
    # step under PyTorch's per-module model (no timeline), where checkpointing a layer matters.
    stats = transformer_case.stats.model_copy(update={"timeline": None})
    units = ["Transformer.layers.1"]
    baseline = planner.plan(stats, 1e6, first_step_only=True).baseline_peak_bytes / 2**30
    lowest = planner.plan(stats, 1e-9, ac_units=units, first_step_only=True).min_feasible_budget_gib
    plan = planner.plan(stats, (lowest + baseline) / 2, ac_units=units, first_step_only=True)
    assert plan.status == "optimal" and [m.fqn for m in plan.modules] == ["Transformer.layers.1"]
    assert plan.modules[0].op_names == [op.name for op in stats.module("Transformer.layers.1").ops]
    model = transformer_case.fresh_copy()
    model.layers[1].feed_forward.gelu = torch.nn.SiLU()
    apply_plan(model, plan.model_dump(mode="json"))  # plan JSON as a client would get it; no stats
    with pytest.raises(PlanMismatchError, match=r"module 'Transformer\.layers\.1': op \d+ is aten\.silu"):
        transformer_case.call(model)

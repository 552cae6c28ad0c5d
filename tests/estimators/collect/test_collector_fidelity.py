"""Fidelity on real CPU runs (issue 4, item 6): fake-tensor stats vs a real training step."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from estimators import apply_plan  # noqa: E402
from planner import optimal_op_policy  # noqa: E402
from est_helpers import live_activation_bytes, saved_bytes_by_hooks  # noqa: E402

TOLERANCE = 0.02  # the 2%


def test_saved_activation_bytes_match_stats(case):
    """(a) Unique storages autograd saves in a real forward vs the root's IA."""
    predicted = case.stats.root.act_saved_bytes
    torch.manual_seed(1)
    measured, _ = saved_bytes_by_hooks(case.model, lambda: case.call())
    assert predicted > 0
    assert abs(measured - predicted) <= TOLERANCE * predicted, (measured, predicted)


def test_live_activations_at_forward_end_match_stats(case):
    """TA of the root (live activation memory at forward end, output included) vs a real run."""
    torch.manual_seed(1)
    measured, out = live_activation_bytes(case.model, lambda: case.call())
    output_bytes = case.stats.root.output_bytes
    predicted = case.stats.root.act_total_bytes - output_bytes
    assert abs(measured - predicted) <= TOLERANCE * predicted, (measured, predicted)
    del out


def half_memory_plan(case) -> tuple[dict, int]:
    """A plan checkpointing every decoder layer, each keeping about half its saved activations.

    Returns the plan and the activation bytes it predicts are kept for backward.
    """
    modules, predicted = [], case.stats.root.act_saved_bytes
    for fqn in case.layers:
        m = case.stats.module(fqn)
        save = optimal_op_policy(m.ops, 0.5 * m.act_saved_bytes / m.op_bytes)
        saved = sum(op.output_bytes for op, s in zip(m.ops, save) if s)
        discarded = m.act_saved_bytes - saved
        modules.append({"fqn": fqn, "discard_ratio": 1 - saved / m.op_bytes, "discarded_bytes": discarded,
                        "saved_bytes": saved, "recompute_ms": 0.0, "save": save})
        predicted -= discarded
    return {"status": "optimal", "memory_budget_gib": 1.0, "modules": modules}, predicted


def test_plan_at_half_memory_keeps_gradients_and_predicted_bytes(case):
    """(b) Same seed, dropout on: equal gradients, and saved bytes as the plan predicts."""
    plan, predicted = half_memory_plan(case)
    baseline = case.stats.root.act_saved_bytes
    assert predicted < 0.8 * baseline  # the plan really discards something

    planned = apply_plan(case.fresh_copy(), plan, stats=case.stats)
    reference = case.fresh_copy()

    torch.manual_seed(1)
    measured, out = live_activation_bytes(planned, lambda: case.call(planned))
    case.loss(out).backward()
    torch.manual_seed(1)
    case.loss(case.call(reference)).backward()

    assert abs(measured - predicted) <= TOLERANCE * predicted, (measured, predicted)
    for (name, p), q in zip(reference.named_parameters(), planned.parameters()):
        assert p.grad is not None, name
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0, msg=f"gradient of {name}")


def test_planner_plan_applies_and_frees_what_it_claims(case):
    """collect -> planner.plan -> apply_plan: the activation bytes the plan says it frees are freed."""
    import planner
    from planner import GIB, baseline_peak_bytes

    # What a plan frees does not depend on the memory model; these tiny models' steady-state peak is
    # their optimizer step, which no plan lowers, so plan the first step under PyTorch's per-module model.
    stats = case.stats.model_copy(update={"timeline": None})
    budget_gib = 0.85 * baseline_peak_bytes(stats, first_step_only=True) / GIB
    plan = planner.plan(stats, memory_budget_gib=budget_gib, first_step_only=True)
    assert plan.status == "optimal" and plan.modules, plan.message
    predicted = case.stats.root.act_saved_bytes - sum(pm.discarded_bytes for pm in plan.modules)

    planned = apply_plan(case.fresh_copy(), plan, stats=case.stats)
    reference = case.fresh_copy()
    torch.manual_seed(1)
    measured, out = live_activation_bytes(planned, lambda: case.call(planned))
    case.loss(out).backward()
    torch.manual_seed(1)
    case.loss(case.call(reference)).backward()

    assert abs(measured - predicted) <= TOLERANCE * predicted, (measured, predicted)
    for (name, p), q in zip(reference.named_parameters(), planned.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0, msg=f"gradient of {name}")


def test_reapplying_replaces_the_plan_and_remove_restores_the_model(transformer_case):
    from estimators import remove_plan

    case = transformer_case
    plan, predicted = half_memory_plan(case)
    first_only = {**plan, "modules": plan["modules"][:1]}
    model = apply_plan(case.fresh_copy(), first_only, stats=case.stats)
    apply_plan(model, plan, stats=case.stats)  # both layers now, each wrapped once
    torch.manual_seed(1)
    measured, _ = live_activation_bytes(model, lambda: case.call(model))
    assert abs(measured - predicted) <= TOLERANCE * predicted, (measured, predicted)

    remove_plan(model)
    baseline = case.stats.root.act_saved_bytes
    torch.manual_seed(1)
    measured, _ = live_activation_bytes(model, lambda: case.call(model))
    assert abs(measured - baseline) <= TOLERANCE * baseline, (measured, baseline)


def test_backward_figures_are_consistent(case):
    """Backward allocates no activations: live activations only fall, layer by layer in reverse order."""
    root = case.stats.root
    first, second = (case.stats.module(f) for f in case.layers)
    assert root.act_total_bytes >= second.act_bw_bytes >= first.act_bw_bytes > 0
    assert first.act_grad_bytes > 0 and second.act_grad_bytes > 0
    # Gradients accumulate: the later layer's backward ends before the earlier one's.
    assert second.grad_total_bytes <= first.grad_total_bytes <= root.grad_total_bytes == root.grad_bytes

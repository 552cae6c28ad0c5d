"""Stats of a step with gradient accumulation (issue 27): moments per micro-batch, plans that say which one."""

from __future__ import annotations

import pytest

import planner
from planner import parse_stats


def _doc(grad_accumulation: int | None) -> dict:
    """One checkpointable block discarding 500 bytes; per micro-batch a forward moment (key 1: the block done) and
    a backward one; the second micro-batch holds the first one's 300 bytes of gradients."""
    ops = [{"name": "aten.mm", "runtime_ms": 1.0, "output_bytes": 500, "saved_by_autograd": True}]
    micro = [None] if grad_accumulation is None else list(range(1, grad_accumulation + 1))
    timeline = []
    for k in micro:
        grads = 0 if k in (None, 1) else 300
        timeline += [{"phase": "forward", "key": 1, "activation_bytes": 700, "grad_bytes": grads, "micro_batch": k},
                     {"phase": "backward", "key": 2, "activation_bytes": 800, "grad_bytes": grads + 100,
                      "micro_batch": k}]
    timeline.append({"phase": "optimizer", "key": 0, "activation_bytes": 100, "grad_bytes": 300,
                     "optimizer_bytes": 50})
    meta = {"model_name": "tiny"}
    if grad_accumulation is not None:
        meta["grad_accumulation"] = grad_accumulation
    return {
        "metadata": meta,
        "fw_pre_order": ["M", "M.block", "M.head"],
        "fw_post_order": ["M.block", "M.head", "M"],
        "modules": [
            {"fqn": "M", "parent": None, "is_leaf": False, "param_bytes": 1000},
            {"fqn": "M.block", "parent": "M", "is_leaf": False, "act_saved_bytes": 500, "ops": ops},
            {"fqn": "M.head", "parent": "M", "is_leaf": True},
        ],
        "timeline": timeline,
    }


def test_a_step_without_accumulation_keeps_its_document():
    doc = parse_stats(_doc(None)).model_dump(mode="json")
    assert "grad_accumulation" not in doc["metadata"]
    assert all("micro_batch" not in t for t in doc["timeline"])


def test_the_peak_is_in_the_micro_batch_that_holds_the_gradients():
    stats = parse_stats(_doc(2))
    # no checkpointing: micro-batch 2's backward, 1000 + 800 + 300 + 100 = 2200 bytes (the optimizer state, 0 here)
    assert planner.baseline_peak_bytes(stats) == 2200
    plan = planner.plan(stats, 2000 / planner.GIB)
    assert plan.status == "optimal" and [m.fqn for m in plan.modules] == ["M.block"]
    # the block discards 500 bytes (key 2: no backward has reached it yet): micro-batch 2's backward 1700, its
    # forward 1000 + 700 + 300 - 500 = 1500, micro-batch 1's backward 1400, the optimizer step 1450
    assert plan.peak_bytes == 1700
    assert plan.peak_micro_batch == 2 and "(micro-batch 2 of 2)" in plan.peak_at


def test_recompute_counts_once_per_micro_batch():
    doc = _doc(3)
    doc["timeline"][0]["activation_bytes"] = doc["timeline"][2]["activation_bytes"] = 2000  # forward peaks
    stats = parse_stats(doc)
    plan = planner.plan(stats, 3000 / planner.GIB)
    assert plan.modules and plan.grad_accumulation == 3
    assert plan.recompute_ms == pytest.approx(1.0)
    assert plan.recompute_ms_per_optimizer_step == pytest.approx(3.0)
    assert [t.micro_batch for t in plan.timeline] == [1, 1, 2, 2, 3, 3, None]


@pytest.mark.parametrize("edit, match", [
    (lambda d: d["timeline"][0].update(micro_batch=3), "timeline\\[0\\].micro_batch 3 is not a micro-batch"),
    (lambda d: d["timeline"][-1].update(micro_batch=1), "timeline\\[4\\].micro_batch 1 is not a micro-batch of the "
                                                        "optimizer"),
    (lambda d: d["metadata"].update(grad_accumulation=1), "grad_accumulation"),
])
def test_micro_batches_are_checked(edit, match):
    doc = _doc(2)
    edit(doc)
    with pytest.raises(ValueError, match=match):
        parse_stats(doc)

"""A plan the planner made with offload on, applied to the real model: its promise holds (issue 31 item 3).

The tiny Llama (tests/estimators/est_helpers.py, attention dropout on) is collected with AdamW, planned at 60%
of its predicted no-checkpointing peak with ``offload="on"`` and a host link so fast that a copy never stalls
(1e6 GB/s, ``host_link_gbps`` overrides the stats, which is how a CPU-target plan offloads), applied, and trained
two real CPU steps. Known answers come from the plan: its predicted peak and its host bytes.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import planner  # noqa: E402
from estimators import RooflineCostModel, apply_plan, build_from_hf_config, collect_stats, device_spec  # noqa: E402
from estimators import make_optimizer, measure_steps  # noqa: E402
from est_helpers import TINY_LLAMA  # noqa: E402
from estimators.apply import TOLERATED_OPS  # noqa: E402

FRACTION = 0.6


@pytest.fixture(scope="module")
def planned() -> tuple:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    built = build_from_hf_config(TINY_LLAMA, batch_size=4, seq_len=64, dtype=torch.float32,
                                 device=torch.device("cpu"))
    stats = collect_stats(built.model, built.inputs, optimizer="adamw", device="cpu",
                          cost_model=RooflineCostModel(device_spec("cpu")))
    baseline = planner.baseline_peak_bytes(stats)
    plan = planner.plan(stats, FRACTION * baseline / planner.GIB, offload="on", host_link_gbps=1e6)
    yield built, stats, plan
    torch.set_num_threads(threads)


def test_planned_offload_holds_its_peak_and_host_bytes(planned):
    built, stats, plan = planned
    assert plan.status == "optimal" and plan.host_bytes, (plan.status, plan.message)
    model = apply_plan(copy.deepcopy(built.model), plan, stats=stats, example_inputs=built.inputs)
    steps = measure_steps(model, built.inputs, None, make_optimizer("adamw", list(model.parameters())), steps=2)
    budget = plan.memory_budget_gib * planner.GIB
    assert all(s.peak_bytes <= budget for s in steps), ([s.peak_bytes for s in steps], budget)
    assert abs(steps[1].peak_bytes - plan.peak_bytes) <= 0.01 * plan.peak_bytes, (steps[1].peak_bytes,
                                                                                  plan.peak_bytes)
    # Host bytes: the plan's, less the tolerated ops it lists as offloaded (scalar constants: an eager run
    # recomputes every op of TOLERATED_OPS whatever the plan says, estimators/apply/alignment.py)
    tolerated = sum(op.output_bytes for pm in plan.modules for k, op in enumerate(stats.module(pm.fqn).ops)
                    if pm.offload and pm.offload[k] and op.name in TOLERATED_OPS)
    assert steps[1].host_peak_bytes == plan.host_bytes - tolerated, (steps[1].host_peak_bytes, plan.host_bytes)


def test_planned_offload_gradients_equal_the_unplanned_run(planned):
    built, stats, plan = planned
    grads = []
    for p in (None, plan):
        model = copy.deepcopy(built.model)
        if p is not None:
            apply_plan(model, p, stats=stats)
        torch.manual_seed(5)  # the same dropout masks
        model(**built.inputs).loss.backward()
        grads.append([q.grad for q in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))

"""Offloading a module called more than once (per call): planned, applied and run for real on the CPU stand-in.

Two blocks, each applying its one MLP twice (``x + mlp(x)`` then ``x + mlp(x)`` again, as the fidelity set's
``twice_mlp``), collected with AdamW, planned at 75% of the predicted no-checkpointing peak with
``offload="on"`` and a link so fast that a copy never stalls (1e6 GB/s). At that budget the least plan
checkpoints both MLPs and offloads part of what they save, per call (found by running it: 2 x 262144 bytes
each; 50-85% all offload per call). Known answers come from the plan and the stats: each call offloads the
module's ``offloaded_bytes``, so the host holds ``calls`` x those bytes; each call's offloads are off the device
exactly where that call's discard is (``MemoryModel.profile_bytes``).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import planner  # noqa: E402
from estimators import PlanMismatchError, RooflineCostModel, apply_plan, collect_stats, device_spec  # noqa: E402
from estimators import make_optimizer  # noqa: E402
from estimators import measure_steps  # noqa: E402
from estimators.apply import planned_modules  # noqa: E402
from planner.solve.offload import host_link, offload_setup  # noqa: E402
from planner.solve.problem import prepare  # noqa: E402

D, H, B = 32, 128, 512
FRACTION = 0.75


class TwiceBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(D, H), nn.GELU(), nn.Linear(H, D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mlp(x)
        return x + self.mlp(x)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(TwiceBlock() for _ in range(2))
        self.head = nn.Linear(D, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x).square().mean()


@pytest.fixture(scope="module")
def planned() -> tuple:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, x = Net(), torch.randn(B, D)
    stats = collect_stats(model, (x,), optimizer="adamw", device="cpu",
                          cost_model=RooflineCostModel(device_spec("cpu")))
    baseline = planner.baseline_peak_bytes(stats)
    plan = planner.plan(stats, FRACTION * baseline / planner.GIB, offload="on", host_link_gbps=1e6)
    yield model, x, stats, plan
    torch.set_num_threads(threads)


def test_the_plan_offloads_per_call_and_the_host_holds_every_call(planned):
    _, _, stats, plan = planned
    assert plan.status == "optimal", (plan.status, plan.message)
    per_call = [m for m in plan.modules if m.offload_calls]
    assert per_call and all(m.offload_calls == stats.module(m.fqn).calls == 2 for m in per_call), plan.modules
    assert plan.host_bytes == sum(m.offloaded_bytes * (m.offload_calls or 1) for m in plan.modules if m.offload)
    assert plan.host_bytes > 0
    # the windows carry none of it: their bytes are the window protocol's only
    assert sum(w.offloaded_bytes for w in plan.offload_windows) == sum(
        m.offloaded_bytes for m in plan.modules if m.offload and not m.offload_calls)


def test_a_per_call_credit_is_more_of_the_module_discard(planned):
    _, _, stats, plan = planned
    prob = prepare(stats)
    m = next(m for m in plan.modules if m.offload_calls)
    model = prob.model
    assert m.fqn in model.repeats and model.repeats[m.fqn].max() > 0  # later calls discard somewhere
    d, b = float(m.discarded_bytes), float(m.offloaded_bytes)
    np.testing.assert_allclose(model.profile_bytes({m.fqn: d}, offloaded={m.fqn: b}),
                               model.profile_bytes({m.fqn: d + b}))
    setup = offload_setup(prob, host_link(stats, 1e6))
    index = next(i for i, c in enumerate(prob.candidates) if c.fqn == m.fqn)
    assert index in setup.per_call and index not in setup.options


def test_real_steps_hold_the_plan_host_bytes_and_gradients(planned):
    model, x, stats, plan = planned
    applied = apply_plan(copy.deepcopy(model), plan, stats=stats)
    steps = measure_steps(applied, (x,), None, make_optimizer("adamw", list(applied.parameters())), steps=2)
    budget = plan.memory_budget_gib * planner.GIB
    assert all(s.peak_bytes <= plan.peak_bytes <= budget for s in steps), ([s.peak_bytes for s in steps],
                                                                            plan.peak_bytes, budget)
    assert steps[1].peak_bytes >= 0.99 * plan.peak_bytes, (steps[1].peak_bytes, plan.peak_bytes)
    assert steps[1].host_peak_bytes == plan.host_bytes, (steps[1].host_peak_bytes, plan.host_bytes)
    # every call's offloads left the device at its own forward end (the drop checks each storage is dead):
    # after a forward the store holds every call's copies, none stashed
    store = planned_modules(applied)[0].host_store
    loss = applied(x)
    assert store.host_bytes == plan.host_bytes
    assert all(h.stashed is None for h in store.on_host.values())
    loss.backward()
    assert store.host_bytes == 0  # each call's recomputation took its copies back

    grads = []
    for m in (copy.deepcopy(model), apply_plan(copy.deepcopy(model), plan, stats=stats)):
        m(x).backward()
        grads.append([p.grad for p in m.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_per_call_offloading_is_refused_under_compile(planned):
    model, x, stats, plan = planned
    with pytest.raises(PlanMismatchError, match="offloads per call .* runs eagerly only"):
        apply_plan(copy.deepcopy(model), plan, stats=stats, example_inputs=(x,), compile_backend="aot_eager")


def test_a_host_memory_cap_counts_every_call(planned):
    _, _, stats, plan = planned
    cap = plan.host_bytes // 2  # every call's copies count against it: a per-call term left out would exceed it
    capped = planner.plan(stats, plan.memory_budget_gib, offload="on", host_link_gbps=1e6,
                          host_budget_gib=cap / planner.GIB)
    assert capped.status == "optimal" and capped.host_bytes <= cap, (capped.status, capped.host_bytes, cap)
    assert capped.peak_bytes <= plan.memory_budget_gib * planner.GIB

"""A module's last op past checkpointing's early stop is never free to save.

Found on the fidelity harness's qwen2_moe_bmm (bench/RESULTS.md "Fidelity"):
its shared expert runs first in the MoE block and its output is saved by a
later multiply, so the collector zeroed the bytes of its last op (PyTorch's
convention: the block output is kept anyway). A recompute stops before that
op, so saving it cost nothing in the model, and plans saved it; but SAC then
caches the output in forward and, never reaching it in the recompute, holds
it until the module's backward ends, which comes after the multiply's: the
real steady-state peak was one output (0.5 MiB) above the prediction.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import planner  # noqa: E402
from estimators import RooflineCostModel, apply_plan, collect_stats, device_spec, make_optimizer  # noqa: E402
from estimators import measure_steps  # noqa: E402


class Expert(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.up, self.down = nn.Linear(dim, 4 * dim, bias=False), nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class Block(nn.Module):
    """The shared expert first, a wide branch after it, then the expert's output into a multiply (which saves it)."""

    def __init__(self, dim: int = 64):
        super().__init__()
        self.shared = Expert(dim)
        self.wide = Expert(4 * dim)
        self.gate = nn.Linear(dim, dim)
        self.into, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        s = self.shared(x)
        w = self.out(self.wide(self.into(x)))
        return (w + torch.sigmoid(self.gate(x)) * s).square().mean()


def test_output_past_the_stop_keeps_its_bytes_and_a_plan_holds_exactly():
    torch.manual_seed(0)
    model, x = Block(), torch.randn(512, 64)
    stats = collect_stats(model, (x,), loss_fn=lambda out: out, optimizer="adamw", device="cpu",
                          cost_model=RooflineCostModel(device_spec("cpu")))
    shared = stats.module("Block.shared")
    last = shared.ops[-1]
    assert shared.recompute_op_count < len(shared.ops) and last.saved_by_autograd  # the case this is about
    assert last.output_bytes == 512 * 64 * 4  # its real bytes, not 0
    baseline = planner.baseline_peak_bytes(stats)
    plan = planner.plan(stats, (baseline - 1) / planner.GIB, ac_units=["Block.shared"])
    assert [m.fqn for m in plan.modules] == ["Block.shared"] and plan.modules[0].save[-1] == 0
    apply_plan(model, plan, stats=stats)
    steps = measure_steps(model, (x,), lambda out: out, make_optimizer("adamw", list(model.parameters())), steps=2)
    assert steps[1].peak_bytes <= plan.memory_budget_gib * planner.GIB
    assert steps[1].peak_bytes == plan.peak_bytes  # exact: every storage counted, nothing hidden

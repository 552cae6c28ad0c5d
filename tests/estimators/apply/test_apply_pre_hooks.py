"""A planned module's own forward pre-hooks run inside its checkpoint (issue 29: torchtitan's sequence parallel).

torchtitan's parallelize functions gather a block's sequence shards in a forward pre-hook of the block
(``PrepareModuleInput`` on attention and the MLP). The collector counts a module's own pre-hooks as its ops,
and torchtitan's checkpoint wrapper runs them inside the checkpoint; ``apply_plan`` checkpointed ``forward``
alone, so a plan checkpointing such a block failed with ``PlanMismatchError`` (seen on qwen2 at TP x2 with
sequence parallel: "op 2 is aten.addmm but the plan's stats have _c10d_functional.all_gather_into_tensor"), and
with the hook inside, the checkpoint holds the block's keyword input from before the hook, which the collector
saw only after it (131,072 bytes under the prediction there). Here a plain hook stands in for the gather (the
multi-rank run is bench/bench_tensor_parallel.py): it doubles each block's keyword input along the batch.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import planner  # noqa: E402
from estimators import (RooflineCostModel, apply_plan, collect_stats, device_spec, make_optimizer,  # noqa: E402
                        measure_steps, remove_plan)

ROWS, WIDTH = 256, 64


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, *, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(hidden_states)))


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.head = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, 1)
        self.blocks = nn.ModuleList([_Block(), _Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x)) * 2.0  # a block input nothing but its checkpoint holds
        for block in self.blocks:
            h = block(hidden_states=h)[:ROWS] + h  # the stream stays ROWS long
        return self.head(h).square().mean()


def _gather(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    h = kwargs["hidden_states"]
    return args, {**kwargs, "hidden_states": torch.cat([h, h * 0.5])}


def _net() -> _Net:
    torch.manual_seed(0)
    net = _Net()
    for block in net.blocks:
        block.register_forward_pre_hook(_gather, with_kwargs=True)
    return net


def _steps(net: _Net, x: torch.Tensor) -> tuple[list[int], list[torch.Tensor]]:
    opt = make_optimizer("adamw", list(net.parameters()), foreach=False)
    steps = measure_steps(net, (x,), lambda loss: loss, opt, steps=2, seed=1)
    return [m.peak_bytes for m in steps], [p.detach().clone() for p in net.parameters()]


def test_a_pre_hook_gather_is_checkpointed_with_its_block_as_predicted() -> None:
    x = torch.randn(ROWS, WIDTH)
    stats = collect_stats(_net(), (x,), loss_fn=lambda loss: loss, optimizer="adamw",
                          cost_model=RooflineCostModel(device_spec("cpu")))
    # the hook's ops, counted as the block's
    assert [op.name for op in stats.module("_Net.blocks.0").ops[:2]] == ["aten.mul", "aten.cat"]
    plan = planner.plan(stats, planner.min_feasible_budget_gib(stats))
    assert "_Net.blocks.0" in [m.fqn for m in plan.modules], plan.modules
    peaks, params = _steps(apply_plan(_net(), plan, stats=stats), x)  # PlanMismatchError with the hook outside
    _, ref_params = _steps(_net(), x)
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))
    # held: the block's keyword input from before the hook, 64 KiB (the hook's own output is recomputed)
    assert peaks[1] == plan.peak_bytes, (peaks, plan.peak_bytes)
    unplanned = remove_plan(apply_plan(_net(), plan, stats=stats))  # the hooks are the module's again
    assert unplanned.blocks[0](hidden_states=torch.ones(3, WIDTH)).shape == (6, WIDTH)

"""What a checkpointed module really re-runs, and modules called more than once (issue 16).

``recompute_op_count`` is checked against PyTorch itself: each module is
checkpointed in a real step (``torch.utils.checkpoint``, non-reentrant, the
way ``apply_plan`` runs a plan) and the ops its recompute runs are counted
by a dispatch mode in the checkpoint's recompute context.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

import planner  # noqa: E402
from estimators import RooflineCostModel, apply_plan, collect_stats, device_spec, module_fqns  # noqa: E402
from estimators.common import SAC_IGNORED_OPS  # noqa: E402
from estimators import build_from_hf_config, make_optimizer, measure_steps  # noqa: E402
from est_helpers import TINY_LLAMA  # noqa: E402


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func not in SAC_IGNORED_OPS
        return func(*args, **(kwargs or {}))


def _real_ops(model: nn.Module, module: nn.Module, call) -> tuple[int, int]:
    """Ops ``module``'s forward and its recompute run in a real step, checkpointed as apply_plan checkpoints."""
    counters = _CountOps(), _CountOps()
    inner = module.forward

    def forward(*args, **kwargs):
        return checkpoint(inner, *args, use_reentrant=False, context_fn=lambda: counters, **kwargs)

    module.forward = forward
    try:
        call(model).backward()
    finally:
        module.forward = inner
    return counters[0].count, counters[1].count


class _Head(nn.Module):
    """Two layers and a tail autograd saves nothing in (``* 2 + 1``): a recompute stops before the tail."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8), nn.Tanh())

    def forward(self, x):
        return self.body(x) * 2 + 1


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.head = _Head()

    def forward(self, x):
        return self.head(self.inp(x))


def _tiny_llama(batch_size: int = 1, seq_len: int = 16):
    torch.manual_seed(0)
    built = build_from_hf_config(TINY_LLAMA, batch_size=batch_size, seq_len=seq_len, dtype=torch.float32,
                                 device=torch.device("cpu"))
    built.model.eval()  # no attention dropout: its mask is drawn again in the recompute, and compared
    return built.model, built.inputs, lambda m: m(**built.inputs).loss


def _net():
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    return _Net(), (x,), lambda m: m(x).sum()


@pytest.mark.parametrize("make", [_net, _tiny_llama], ids=["net", "tiny_llama"])
def test_recompute_op_count_is_what_pytorch_recomputes(make):
    model, inputs, call = make()
    kwargs = inputs if isinstance(inputs, dict) else {}
    args = () if isinstance(inputs, dict) else inputs
    loss_fn = None if isinstance(inputs, dict) else (lambda out: out.sum())
    stats = collect_stats(model, args or kwargs, loss_fn=loss_fn, optimizer="none", device="cpu",
                          cost_model=RooflineCostModel(device_spec("cpu")))
    by_fqn = {fqn: mod for mod, fqn in module_fqns(model).items()}
    checked = []
    for m in stats.modules:
        if m.ops is None or m.parent is None:
            continue
        assert m.recompute_op_count is not None and m.recompute_op_count <= len(m.ops), m.fqn
        forward, recomputed = _real_ops(model, by_fqn[m.fqn], call)
        if forward == len(m.ops):  # LlamaModel builds its causal mask with other ops for real than when fake
            assert recomputed == m.recompute_op_count, m.fqn
            checked.append(m.fqn)
    assert len(checked) >= 2 and all(f"layers.{i}{sub}" in " ".join(checked) for i in (0, 1)
                                     for sub in ("", ".self_attn", ".mlp")) if make is _tiny_llama else checked
    if make is _net:  # by hand: t, addmm, relu, t, addmm, tanh (saves its output); not the tail mul, add
        assert stats.module("_Net.head").recompute_op_count == 6 < len(stats.module("_Net.head").ops)


def test_recompute_op_count_prices_the_plan():
    """Ops past recompute_op_count cost nothing, the others their runtime less saved_op_overhead_ms (>= 0)."""
    model, inputs, _ = _tiny_llama(4, 64)  # activations outweigh parameters
    stats = collect_stats(model, inputs, optimizer="none", device="cpu",
                          cost_model=RooflineCostModel(device_spec("cpu")))
    for m in stats.modules:
        if m.ops is not None:
            m.checkpoint_overhead_ms, m.saved_op_overhead_ms = 0.5, 1e-4
    plan = planner.plan(stats, 0.6 * planner.baseline_peak_bytes(stats) / planner.GIB)
    assert plan.status == "optimal" and plan.modules, plan.message
    total, tail = 0.0, 0
    for pm in plan.modules:
        m = stats.module(pm.fqn)
        expected = 0.5 + sum(max(0.0, op.runtime_ms - 1e-4) for i, op in enumerate(m.ops)
                             if not pm.save[i] and i < m.recompute_op_count and not op.view_like)
        assert pm.recompute_ms == pytest.approx(expected, rel=1e-9), pm.fqn
        total += expected
        tail += sum(op.runtime_ms > 1e-4 for op, s in zip(m.ops[m.recompute_op_count:], pm.save[m.recompute_op_count:])
                    if not s)
    assert plan.recompute_ms == pytest.approx(total, rel=1e-9)
    assert tail  # the plan recomputes ops a recompute never re-runs: priced at 0, not at their runtime


class _SharedLayer(nn.Module):
    """One encoder layer applied three times (ALBERT's parameter sharing)."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, dim)
        self.layer = nn.TransformerEncoderLayer(dim, 4, 4 * dim, dropout=0.1, batch_first=True)
        self.head = nn.Linear(dim, 10)

    def forward(self, ids):
        x = self.embed(ids)
        for _ in range(3):
            x = self.layer(x)
        return self.head(x.mean(1))


def test_a_shared_layer_is_counted_per_call_and_its_plan_holds():
    torch.manual_seed(0)
    model, ids = _SharedLayer().train(), torch.randint(0, 256, (4, 64))

    def loss_fn(out):
        return nn.functional.cross_entropy(out, torch.arange(out.shape[0]) % out.shape[1])

    stats = collect_stats(model, (ids,), loss_fn=loss_fn, optimizer="adamw", device="cpu",
                          cost_model=RooflineCostModel(device_spec("cpu")))
    layer = stats.module("_SharedLayer.layer")
    assert layer.calls == 3 and stats.module("_SharedLayer.layer.self_attn").calls == 3
    assert stats.root.calls == 1
    baseline = planner.baseline_peak_bytes(stats)
    plan = planner.plan(stats, 0.9 * baseline / planner.GIB)
    assert plan.status == "optimal" and plan.modules, plan.message
    for pm in plan.modules:  # every call recomputes
        m = stats.module(pm.fqn)
        assert pm.recompute_ms == pytest.approx(m.calls * (pm.checkpoint_overhead_ms + sum(
            op.runtime_ms for op, s in zip(m.recompute_ops, pm.save) if not s)))
    planned = copy.deepcopy(model)
    apply_plan(planned, plan, stats=stats)
    opt = make_optimizer("adamw", list(planned.parameters()))
    peaks = [s.peak_bytes for s in measure_steps(planned, (ids,), loss_fn, opt, steps=2)]
    # The later calls' discards are not credited: the prediction is an upper bound, not exact.
    assert max(peaks) <= plan.peak_bytes <= plan.memory_budget_gib * planner.GIB, (peaks, plan.peak_bytes)

"""A plan made under autocast applies only under the same autocast (issue 27, item 2)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import planner  # noqa: E402
from estimators import (PlanMismatchError, RooflineCostModel, apply_plan, build_from_hf_config,  # noqa: E402
                        collect_stats, device_spec, make_optimizer, measure_steps)
from estimators.common import TrainingLoop  # noqa: E402
from est_helpers import TINY_LLAMA  # noqa: E402
from torch import nn  # noqa: E402


def _planned(autocast: str | None):
    torch.manual_seed(0)
    built = build_from_hf_config(TINY_LLAMA, batch_size=4, seq_len=64, dtype=torch.float32,
                                 device=torch.device("cpu"))
    stats = collect_stats(built.model, built.inputs, autocast=autocast, device="cpu",
                          cost_model=RooflineCostModel(device_spec("cpu")))
    plan = planner.plan(stats, 0.7 * planner.baseline_peak_bytes(stats) / planner.GIB)
    assert plan.modules
    model = copy.deepcopy(built.model)
    apply_plan(model, plan, stats=stats)
    return model, built.inputs, stats, plan


def test_running_without_the_stats_autocast_names_both():
    model, inputs, _, _ = _planned("bf16")
    with pytest.raises(PlanMismatchError, match="runs under autocast off but the stats were collected with "
                                                "autocast bf16"):
        model(**inputs)


def test_running_under_autocast_the_stats_did_not_have_names_both():
    model, inputs, _, _ = _planned(None)
    with torch.autocast("cpu", dtype=torch.bfloat16), \
            pytest.raises(PlanMismatchError, match="runs under autocast bf16 but the stats were collected with "
                                                   "autocast off.*--autocast bf16"):
        model(**inputs)


def test_the_dry_check_runs_forward_under_the_stats_autocast():
    model, inputs, stats, plan = _planned("fp16")
    apply_plan(model, plan, stats=stats, example_inputs=inputs)  # no mismatch: the check ran under fp16 autocast
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(**inputs).loss
    loss.backward()  # outside autocast, as PyTorch advises (inside, its cache skips the recompute's casts)


class _AutocastInside(nn.Module):
    """A model whose own forward turns autocast on around its blocks, as a wrapper or a training module may."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
                                      for _ in range(3)])

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.blocks(x).float().pow(2).mean()


def test_autocast_inside_the_model_needs_no_option_and_holds():
    torch.manual_seed(0)
    model, x = _AutocastInside(), torch.randn(2048, 64)
    stats = collect_stats(model, (x,), loss_fn=lambda out: out, device="cpu",
                          cost_model=RooflineCostModel(device_spec("cpu")))
    assert stats.metadata.model_settings["autocast"] == "bf16"  # seen at its blocks
    plan = planner.plan(stats, 0.8 * planner.baseline_peak_bytes(stats) / planner.GIB)
    assert plan.modules
    planned = copy.deepcopy(model)
    apply_plan(planned, plan, stats=stats, example_inputs=(x,), loss_fn=lambda out: out)
    peaks = [s.peak_bytes for s in measure_steps(planned, (x,), lambda out: out,
                                                 make_optimizer("adamw", list(planned.parameters())), steps=2,
                                                 loop=TrainingLoop())]
    assert all(p <= plan.memory_budget_gib * planner.GIB for p in peaks), (peaks, plan)
    assert abs(peaks[1] / plan.peak_bytes - 1) <= 0.01, (peaks, plan.peak_bytes)

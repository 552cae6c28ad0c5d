"""PNG charts of plans and sweeps (matplotlib's Agg canvas: no display, one figure per call)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from planner import GIB, Stats, memory_model

__all__ = ["memory_profile_bytes", "plan_chart_png", "sweep_chart_png"]


def memory_profile_bytes(stats: Stats, discarded_bytes: dict[str, float], world_size: int = 1) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Per-module memory m_n in forward post-order, without and with the discards.

    The same model the planner's peak uses (``planner.memory_model``): a module's
    discard frees memory at every module after it in forward post-order.
    """
    model = memory_model(stats, world_size=world_size)
    with_plan = model.profile_bytes(discarded_bytes)
    order = np.argsort(model.post_pos)
    return [model.fqns[i] for i in order], model.base_bytes[order], with_plan[order]


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buf)
    return buf.getvalue()


def _short(fqn: str, root: str) -> str:
    return fqn.removeprefix(root + ".") if fqn != root else fqn


def plan_chart_png(stats: Stats, plan: dict[str, Any]) -> bytes:
    """Memory at each module across the step, with and without the plan, and the budget line."""
    discarded = {m["fqn"]: float(m["discarded_bytes"]) for m in plan.get("modules", [])}
    fqns, base, planned = memory_profile_bytes(stats, discarded, plan.get("world_size", 1))
    x = np.arange(len(fqns))
    fig = Figure(figsize=(10, 4.8), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ax.plot(x, base / GIB, color="tab:gray", marker=".", label="no checkpointing")
    if plan.get("status") in ("optimal", "feasible"):
        ax.plot(x, planned / GIB, color="tab:blue", marker=".", label="with plan")
        ax.fill_between(x, planned / GIB, base / GIB, color="tab:blue", alpha=0.15, label="freed by recomputation")
    ax.axhline(plan["memory_budget_gib"], color="tab:red", linestyle="--",
               label=f"budget {plan['memory_budget_gib']:g} GiB")
    if len(fqns) <= 48:
        root = stats.root.fqn
        ax.set_xticks(x, [_short(f, root) for f in fqns], rotation=70, fontsize=7, ha="right")
    ax.set_xlabel("module (forward post-order)")
    ax.set_ylabel("memory, GiB")
    rec = plan.get("recompute_ms")
    extra = f", recompute {rec:.2f} ms" if rec is not None else ""
    ax.set_title(f"{stats.metadata.model_name}: {plan['status']}{extra}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _png(fig)


def sweep_chart_png(model_name: str, plans: Sequence[dict[str, Any]], baseline_peak_bytes: int) -> bytes:
    """Recompute time against memory budget (the Pareto curve); infeasible budgets marked on the axis."""
    ok = [p for p in plans if p["status"] in ("optimal", "feasible") and p.get("recompute_ms") is not None]
    bad = [p for p in plans if p not in ok]
    fig = Figure(figsize=(8, 4.8), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    if ok:
        ax.plot([p["memory_budget_gib"] for p in ok], [p["recompute_ms"] for p in ok],
                marker="o", color="tab:blue", label="recompute time of the plan")
    if bad:
        ax.plot([p["memory_budget_gib"] for p in bad], [0.0] * len(bad), linestyle="none",
                marker="x", color="tab:red", label="no plan (infeasible / error)")
    ax.axvline(baseline_peak_bytes / GIB, color="tab:gray", linestyle="--", label="peak without checkpointing")
    ax.set_xlabel("memory budget, GiB")
    ax.set_ylabel("recompute time, ms")
    ax.set_title(f"{model_name}: recompute vs budget")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _png(fig)

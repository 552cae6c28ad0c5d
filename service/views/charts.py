"""PNG charts of plans and sweeps (matplotlib's Agg canvas: no display, one figure per call)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from planner import GIB, Stats, memory_model

__all__ = ["plan_chart_png", "sweep_chart_png"]


def _moments(stats: Stats, plan: dict[str, Any]) -> tuple[list[tuple[str, str | None]], np.ndarray, np.ndarray, str]:
    """The plan's moments, their memory without and with it, and where its peak is."""
    timeline = plan.get("timeline")
    if timeline:
        base = np.array([t["baseline_bytes"] for t in timeline], dtype=np.float64)
        planned = np.array([t["planned_bytes"] if t.get("planned_bytes") is not None else np.nan for t in timeline])
        return [(t["phase"], t.get("module")) for t in timeline], base, planned, plan["peak_at"]
    # a plan stored by an older planner: its moments re-derived, and described, by the memory model
    model = memory_model(stats, world_size=plan.get("world_size", 1),
                         first_step_only=plan.get("first_step_only", False))
    planned = model.profile_bytes({m["fqn"]: float(m["discarded_bytes"]) for m in plan.get("modules", [])},
                                  saves={m["fqn"]: m["save"] for m in plan.get("modules", []) if m.get("save")})
    shown = planned if plan.get("status") in ("optimal", "feasible") else model.base_bytes
    return (list(zip(model.phases, model.modules)), model.base_bytes, planned,
            model.describe(int(np.argmax(shown))))


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buf)
    return buf.getvalue()


def _short(fqn: str, root: str) -> str:
    return fqn.removeprefix(root + ".") if fqn != root else fqn


_PHASE_COLORS = {"forward": "tab:green", "backward": "tab:orange", "optimizer": "tab:purple"}


def plan_chart_png(stats: Stats, plan: dict[str, Any]) -> bytes:
    """Memory across the step (forward, backward, optimizer step), with and without the plan, the budget and the peak."""
    moments, base, planned, peak_at = _moments(stats, plan)
    x = np.arange(len(moments))
    fig = Figure(figsize=(10, 4.8), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    _phase_bands(ax, [phase for phase, _ in moments])
    ax.plot(x, base / GIB, color="tab:gray", marker=".", markersize=3, label="no checkpointing")
    shown = base
    if plan.get("status") in ("optimal", "feasible") and not np.all(np.isnan(planned)):
        ax.plot(x, planned / GIB, color="tab:blue", marker=".", markersize=3, label="with plan")
        ax.fill_between(x, planned / GIB, base / GIB, color="tab:blue", alpha=0.15, label="freed by recomputation")
        shown = planned
    ax.axhline(plan["memory_budget_gib"], color="tab:red", linestyle="--",
               label=f"budget {plan['memory_budget_gib']:g} GiB")
    peak = int(np.nanargmax(shown))
    ax.plot([peak], [shown[peak] / GIB], marker="v", color="black", linestyle="none",
            label=f"peak: {peak_at}")
    if len(moments) <= 48:
        root = stats.root.fqn
        ax.set_xticks(x, [_short(m or p, root) for p, m in moments], rotation=70, fontsize=7, ha="right")
    else:
        ax.set_xticks([])
    ax.set_xlabel("the step, in order" if moments and moments[0][0] != "module" else "module (forward post-order)")
    ax.set_ylabel("memory, GiB")
    rec = plan.get("recompute_ms")
    extra = f", recompute {rec:.2f} ms" if rec is not None else ""
    model = plan.get("memory_model")
    ax.set_title(f"{stats.metadata.model_name}: {plan['status']}{extra}" + (f" ({model} model)" if model else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _png(fig)


def _phase_bands(ax: Any, phases: list[str]) -> None:
    """A light band per phase of the step (none for PyTorch's per-module model)."""
    start = 0
    for k in range(1, len(phases) + 1):
        if k == len(phases) or phases[k] != phases[start]:
            color = _PHASE_COLORS.get(phases[start])
            if color:
                ax.axvspan(start - 0.5, k - 0.5, color=color, alpha=0.07, linewidth=0)
                ax.text((start + k - 1) / 2, 1.0, phases[start], transform=ax.get_xaxis_transform(), ha="center",
                        va="bottom", fontsize=8, color=color)
            start = k


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

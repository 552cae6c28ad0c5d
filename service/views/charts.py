"""Charts of plans and sweeps, PNG or SVG (matplotlib's own canvases: no display, one figure per call).

A plan's chart reads at a glance: the step's phases as a labelled strip
above the memory, the memory stacked by what it is (parameters, gradients,
optimizer state, activations, the inputs checkpointing holds) without and
with the plan, the module running at each moment on the x axis (as many
names as fit), the budget, the peak, and for an infeasible budget the
smallest budget with a plan. A pipeline's chart has a bar group per stage:
its peak without and with its plan against the one budget, and under each
stage the microbatches it holds at once and its time per microbatch.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure

from planner import GIB, Stats
from service.views.chart_axes import draw_phase_strip, label_modules, label_phase_strip, short_name
from service.views.memory_kinds import StepMemory, step_memory
from service.views.offload_chart import HOST_LABEL, draw_host_band, draw_windows, offload_words

__all__ = ["ImageFormat", "plan_chart", "sweep_chart", "pipeline_chart"]

ImageFormat = Literal["png", "svg"]

KIND_COLORS = {"parameters": "#4c72b0", "optimizer state": "#8172b3", "gradients": "#dd8452", "reserve": "#937860",
               "activations": "#55a868", "held inputs": "#c44e52"}
_BUDGET = "tab:red"
_MIN_BUDGET = "#b8860b"


def plan_chart(stats: Stats, plan: dict[str, Any], *, image_format: ImageFormat = "png") -> bytes:
    """The step's memory by kind, without and with ``plan``, against its budget; PNG or SVG bytes.

    A plan that offloads adds what is on the host at each moment (hatched, above the device's memory) and a
    panel of its windows: per window what its checkpointed modules keep, recompute and offload.
    """
    memory = step_memory(stats, plan)
    step_phases = memory.phases[0] != "module"
    panels = 2 if memory.planned is not None else 1
    offloads = memory.planned is not None and bool(plan.get("offload_windows"))
    fig = Figure(figsize=(11, 3.1 + 2.6 * panels + 2.6 * offloads), dpi=100, layout="constrained")
    ratios = ([0.09] if step_phases else []) + [1.0] * panels + ([0.8] if offloads else [])
    grid = fig.add_gridspec(len(ratios), 1, height_ratios=ratios)
    first = fig.add_subplot(grid[0])
    axes = [first] + [fig.add_subplot(grid[k], sharex=first) for k in range(1, len(ratios) - offloads)]
    windows_ax = fig.add_subplot(grid[-1]) if offloads else None
    for ax in axes[:-1]:
        ax.tick_params(labelbottom=False)
    strip = axes.pop(0) if step_phases else None
    if strip is not None:
        draw_phase_strip(strip, memory.phases, memory.micro_batches)
    planned_top = 0.0 if memory.planned is None else float(
        (memory.total(memory.planned) + (0.0 if memory.host is None else memory.host)).max())
    top = max(float(memory.total(memory.baseline).max()), planned_top, plan["memory_budget_gib"] * GIB,
              (plan.get("min_feasible_budget_gib") or 0.0) * GIB) * 1.08
    unit = _unit(top)
    _stacked(axes[0], memory.baseline, "without checkpointing", top, unit)
    if memory.planned is not None:
        _stacked(axes[1], memory.planned, "with the plan", top, unit)
        axes[1].plot(np.arange(len(memory.phases)), memory.total(memory.baseline) / unit[1], color="0.35",
                     linestyle=":", linewidth=1.2, drawstyle="steps-mid", label="without checkpointing (total)")
        if memory.host is not None and memory.host.max() > 0:
            draw_host_band(axes[1], memory.total(memory.planned), memory.host, unit)
    for ax in axes:
        _budget_lines(ax, plan, unit)
        _micro_batch_marks(ax, memory.micro_batches)
    _peak(axes[-1], memory, stats.root.fqn, unit)
    axes[-1].set_xlabel("the step, in order: the module running at each moment" if step_phases
                        else "module (forward post-order; PyTorch's per-module model)")
    fig.suptitle(_title(stats, plan), fontsize=11)
    if windows_ax is not None:
        draw_windows(windows_ax, plan, {f: k for k, f in enumerate(stats.fw_post_order)}, stats.root.fqn)
    handles, labels = _legend_entries(axes + [ax for ax in (strip, windows_ax) if ax is not None])
    fig.legend(handles, labels, loc="outside right center", fontsize=8, frameon=False)
    # What fits depends on the layout: lay out with provisional ticks, then name as many modules as fit.
    label_modules(axes[-1], memory.modules, stats.root.fqn, width_px=800)
    canvas = FigureCanvasAgg(fig)
    fig.draw_without_rendering()
    label_modules(axes[-1], memory.modules, stats.root.fqn, width_px=axes[-1].get_window_extent().width)
    if strip is not None:
        label_phase_strip(strip, memory.phases, memory.micro_batches, canvas.get_renderer())
    return _image(fig, image_format)


def _unit(most_bytes: float) -> tuple[str, float]:
    """The largest binary unit that keeps ``most_bytes`` at least 1: GiB, MiB or KiB."""
    return next(((name, scale) for name, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)) if most_bytes >= scale),
                ("KiB", 2**10))


def _amount(nbytes: float, unit: tuple[str, float]) -> str:
    return f"{nbytes / unit[1]:.4g} {unit[0]}"


def _stacked(ax: Any, by_kind: dict[str, np.ndarray], name: str, top_bytes: float, unit: tuple[str, float]) -> None:
    """One stacked band per kind of memory, moment by moment (a step per moment: the moments are discrete)."""
    x = np.arange(len(next(iter(by_kind.values()))))
    bottom = np.zeros(len(x))
    for kind, values in by_kind.items():
        if not np.any(values > 0):
            continue
        ax.fill_between(x, bottom / unit[1], (bottom + values) / unit[1], step="mid", color=KIND_COLORS[kind],
                        alpha=0.85, linewidth=0, label=kind)
        bottom = bottom + values
    ax.set_ylim(0, top_bytes / unit[1])
    ax.set_xlim(-0.5, len(x) - 0.5)
    ax.set_ylabel(f"{name}\nmemory, {unit[0]}", fontsize=9)
    ax.grid(axis="y", alpha=0.3)


def _budget_lines(ax: Any, plan: dict[str, Any], unit: tuple[str, float]) -> None:
    budget = plan["memory_budget_gib"] * GIB
    ax.axhline(budget / unit[1], color=_BUDGET, linestyle="--", linewidth=1.3, label=f"budget {_amount(budget, unit)}")
    smallest = plan.get("min_feasible_budget_gib")
    if smallest is not None:
        label = f"smallest budget with a plan: {smallest:.6g} GiB"
        if unit[0] != "GiB":
            label += f" ({_amount(smallest * GIB, unit)})"
        ax.axhline(smallest * GIB / unit[1], color=_MIN_BUDGET, linestyle="-.", linewidth=1.3, label=label)
        ax.annotate(label, (0.005, smallest * GIB / unit[1]), xycoords=("axes fraction", "data"), xytext=(0, 3),
                    textcoords="offset points", fontsize=8, color=_MIN_BUDGET, va="bottom",
                    bbox={"facecolor": "white", "alpha": 0.8, "linewidth": 0, "pad": 1})


def _micro_batch_marks(ax: Any, micro_batches: Sequence[int | None]) -> None:
    """A dotted line where each micro-batch after the first starts (gradient accumulation)."""
    for k in range(1, len(micro_batches)):
        if micro_batches[k] is not None and micro_batches[k] != micro_batches[k - 1] and micro_batches[k] > 1:
            ax.axvline(k - 0.5, color="0.2", linestyle=(0, (1, 2)), linewidth=1)


def _peak(ax: Any, memory: StepMemory, root: str, unit: tuple[str, float]) -> None:
    shown = memory.total(memory.planned if memory.planned is not None else memory.baseline)
    k = memory.peak_index
    ax.plot([k], [shown[k] / unit[1]], marker="v", markersize=8, color="black", linestyle="none",
            label=f"peak {_amount(shown[k], unit)}: {short_name(memory.peak_at, root)}")


def _legend_entries(axes: list[Any]) -> tuple[list[Any], list[str]]:
    """Every panel's entries once: the kinds of memory bottom to top, then the lines and the phases as drawn."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    host = [k for k in seen if k.startswith(HOST_LABEL)]  # above the kinds of device memory, as drawn
    order = host + [k for k in reversed(KIND_COLORS) if k in seen] + [k for k in seen if k not in KIND_COLORS
                                                                      and k not in host]
    return [seen[k] for k in order], order


def _title(stats: Stats, plan: dict[str, Any]) -> str:
    name, budget, status = stats.metadata.model_name, plan["memory_budget_gib"], plan["status"]
    head = f"{name}, budget {budget:g} GiB"
    if status in ("optimal", "feasible"):
        modules = len(plan.get("modules", []))
        rec = plan.get("recompute_ms") or 0.0
        what = f"{modules} module{'s' * (modules != 1)} checkpointed, recompute {rec:.3g} ms" if modules else \
            "fits without checkpointing"
        return f"{head}: {what}{offload_words(plan)}" + ("" if status == "optimal" else " (best found in time)")
    if status == "infeasible":
        return f"{head}: no plan fits"
    return f"{head}: no plan ({status})"


def _image(fig: Figure, image_format: ImageFormat) -> bytes:
    buf = io.BytesIO()
    if image_format == "svg":
        from matplotlib import rc_context

        with rc_context({"svg.fonttype": "none", "svg.hashsalt": "sacplan"}):  # text as text; stable ids
            FigureCanvasSVG(fig).print_svg(buf)
    else:
        FigureCanvasAgg(fig).print_png(buf)
    return buf.getvalue()


def sweep_chart(model_name: str, plans: Sequence[dict[str, Any]], baseline_peak_bytes: int, *,
                image_format: ImageFormat = "png", without_offload: Sequence[dict[str, Any]] = ()) -> bytes:
    """Recompute time against memory budget (the Pareto curve); budgets without a plan marked on the axis.

    Plans made with ``offload='on'`` draw their step-time overhead (recompute plus copy stall) and, from
    ``without_offload`` (the same budgets planned with ``offload='off'``, those there are), the recompute of the
    best plan that does not offload: the two curves of the same sweep.
    """
    plans = sorted(plans, key=lambda p: p["memory_budget_gib"])
    ok = [p for p in plans if p["status"] in ("optimal", "feasible") and p.get("recompute_ms") is not None]
    bad = [p for p in plans if p not in ok]
    offload = any(p.get("offload") == "on" for p in plans)
    fig = Figure(figsize=(9, 4.8), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    if ok and offload:
        _offload_curves(ax, ok, without_offload)
    elif ok:
        ax.plot([p["memory_budget_gib"] for p in ok], [p["recompute_ms"] for p in ok],
                marker="o", color="tab:blue", label="recompute time of the plan")
    if bad:
        ax.plot([p["memory_budget_gib"] for p in bad], [0.0] * len(bad), linestyle="none",
                marker="x", color=_BUDGET, markersize=8, label="no plan at this budget")
    smallest = next((p["min_feasible_budget_gib"] for p in plans if p.get("min_feasible_budget_gib") is not None),
                    None)
    if smallest is not None:
        ax.axvline(smallest, color=_MIN_BUDGET, linestyle="-.", label=f"smallest budget with a plan: {smallest:.4g} GiB")
    ax.axvline(baseline_peak_bytes / GIB, color="tab:gray", linestyle="--",
               label=f"peak without checkpointing: {baseline_peak_bytes / GIB:.4g} GiB")
    ax.set_xlabel("memory budget, GiB")
    what = "step-time overhead" if offload else "recompute time"
    ax.set_ylabel(f"{what}, ms")
    ax.set_title(f"{model_name}: {what} against memory budget" + (", with and without offloading" if offload else ""),
                 fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _image(fig, image_format)


def _offload_curves(ax: Any, ok: list[dict[str, Any]], without_offload: Sequence[dict[str, Any]]) -> None:
    """With offloading: recompute + stall (and the recompute alone); without: the recompute-only plans' recompute."""
    budgets = [p["memory_budget_gib"] for p in ok]
    ax.plot(budgets, [p.get("step_overhead_ms", p["recompute_ms"]) for p in ok], marker="o", color="tab:blue",
            label="with offloading: recompute + copy stall")
    ax.plot(budgets, [p["recompute_ms"] for p in ok], marker=".", linestyle=":", color="tab:blue", alpha=0.7,
            label="with offloading: of which recompute")
    off = sorted((p for p in without_offload if p["status"] in ("optimal", "feasible")
                  and p.get("recompute_ms") is not None), key=lambda p: p["memory_budget_gib"])
    if off:
        ax.plot([p["memory_budget_gib"] for p in off], [p["recompute_ms"] for p in off], marker="s",
                color="tab:orange", label="without offloading: recompute")
    missing = [p for p in without_offload if p not in off]
    if missing:
        ax.plot([p["memory_budget_gib"] for p in missing], [0.0] * len(missing), linestyle="none", marker="x",
                color="tab:orange", markersize=8, label="without offloading: no plan at this budget")


def pipeline_chart(model_name: str, pipeline: dict[str, Any], *, image_format: ImageFormat = "png") -> bytes:
    """Every stage's peak without and with its plan against the one budget (a ``PipelinePlan`` as JSON)."""
    stages = pipeline["stages"]
    x = np.arange(len(stages))
    baseline = np.array([p.get("baseline_peak_bytes") or 0 for p in stages], dtype=float)
    planned = np.array([p.get("peak_bytes") or 0 for p in stages], dtype=float)
    top = max(float(baseline.max()), float(planned.max()), pipeline["memory_budget_gib"] * GIB,
              (pipeline.get("min_feasible_budget_gib") or 0.0) * GIB) * 1.12
    unit = _unit(top)
    fig = Figure(figsize=(max(6.0, 1.3 * len(stages) + 3.5), 4.8), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ax.bar(x - 0.2, baseline / unit[1], 0.38, color="0.7", label="peak without checkpointing")
    has_plan = planned > 0
    if has_plan.any():
        ax.bar(x[has_plan] + 0.2, planned[has_plan] / unit[1], 0.38, color=KIND_COLORS["activations"],
               label="peak with the stage's plan")
    if not has_plan.all():
        ax.plot(x[~has_plan] + 0.2, [0.0] * int((~has_plan).sum()), linestyle="none", marker="x", color=_BUDGET,
                markersize=9, label="no plan under the budget")
        own = [(k, p["min_feasible_budget_gib"]) for k, p in enumerate(stages)
               if not has_plan[k] and p.get("min_feasible_budget_gib") is not None]
        if own:  # where each stage without a plan would have one
            ax.plot([k + 0.2 for k, _ in own], [b * GIB / unit[1] for _, b in own], linestyle="none", marker="_",
                    markersize=22, markeredgewidth=2.5, color=_MIN_BUDGET, label="the stage's smallest budget")
    _budget_lines(ax, pipeline, unit)
    for k, p in enumerate(stages):
        if has_plan[k]:
            ax.annotate(_amount(planned[k], unit), (k + 0.2, planned[k] / unit[1]), xytext=(0, 2),
                        textcoords="offset points", ha="center", va="bottom", fontsize=7)
    ms = pipeline.get("stage_ms") or [None] * len(stages)
    ax.set_xticks(x, [f"stage {k}\n{n} in flight" + ("" if t is None else f"\n{t:.3g} ms/microbatch")
                      for k, (n, t) in enumerate(zip(pipeline["in_flight"], ms))], fontsize=8)
    ax.set_ylim(0, top / unit[1])
    ax.set_ylabel(f"peak memory per device, {unit[0]}")
    ax.grid(axis="y", alpha=0.3)
    step = pipeline.get("step_ms")
    ax.set_title(f"{model_name}: {len(stages)} stages, {pipeline['schedule']}, {pipeline['microbatches']} microbatches, "
                 + (f"step {step:.4g} ms predicted" if step is not None else "no plan for every stage"), fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    return _image(fig, image_format)

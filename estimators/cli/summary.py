"""The summary ``sacplan collect`` prints: what was collected, whether it fits the target, what to run next.

It formats a :class:`estimators.collect.session.CollectResult` and an
:class:`estimators.cli.guide.Guidance`.
"""

from __future__ import annotations

from typing import Any

from estimators.cli.guide import WORLD_SIZES, Guidance
from estimators.collect import LEFT_OUT_TAG
from planner import GIB, HOST_OVERHEAD_NOTE, Plan, RecomputeSplit, sharding_scope, step_basis

__all__ = ["collect_summary", "guidance_rows", "size_text"]


def collect_summary(result: Any, out: str, guidance: Guidance | None) -> str:
    """The whole summary: the collected step, then (with ``guidance``) its fit and the next command."""
    s = result.stats
    left_out = s.metadata.tags.get(LEFT_OUT_TAG)
    rows = [
        ("model", s.metadata.model_name),
        ("modules", _modules_text(result)),
        ("parameters", f"{result.parameter_count:,} ({size_text(s.root.param_bytes)}"
         f"{' on this rank' if s.metadata.sharding else ''})"),
        ("activations at forward end", size_text(s.root.act_total_bytes)),
        ("baseline peak", f"{size_text(result.baseline_peak_bytes)} (no checkpointing, {_scope(s)})"),
        ("step time", f"{s.root.fw_ms + s.root.bw_ms:.2f} ms (fw {s.root.fw_ms:.2f} + bw {s.root.bw_ms:.2f}) "
         f"on {s.metadata.target_device}: {step_basis(s)}"),
        ("optimizer state", f"{size_text(s.root.optimizer_state_bytes)} ({s.metadata.optimizer})"),
        ("model settings", (", ".join(f"{k}={v}" for k, v in sorted(s.metadata.model_settings.items())) or "none")
         + (f" (attention: {s.metadata.tags['attention']})" if "attention" in s.metadata.tags else "")),
        *([("compiled step", _compiled_text(s.metadata.model_settings["compile_backend"]))]
          if "compile_backend" in s.metadata.model_settings else []),
        ("emulated kernels", s.metadata.tags.get("attention_kernels", "none")),
        ("checkpoint overhead", s.metadata.tags.get("checkpoint_overhead", "not known")),
        ("host link", _host_link_text(s.metadata.host_link_gbps)),
        ("left out", f"{left_out}; never checkpointed on their own, their ops count in the modules they ran "
         f"inside" if left_out else "none"),
        ("written to", out),
    ]
    if guidance is not None:
        rows += [("", "")] + guidance_rows(guidance)
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}".rstrip() for k, v in rows)


def _host_link_text(link: Any) -> str:
    """What offloading activations would copy over (plan with --offload on), or how to give it."""
    if link is None:
        return "none for this target: plan with --offload on --host-link-gbps X to offload activations"
    where = link.source.split(" (")[0]  # the entry and the link; the sources are in the stats
    return f"{link.d2h:g} GB/s to host, {link.h2d:g} back ({where}); plan with --offload on to use it"


def _compiled_text(backend: str) -> str:
    """What a plan from stats collected under ``backend`` predicts, and what is checked (docs/apply.md)."""
    kept = ("predicted: the compiled step (ops as AOTAutograd traces them, the zero gradients its backward is "
            "handed)")
    if backend == "aot_eager":
        return (f"aot_eager, {kept}, outside checkpointed modules what its partitioner saves; checked: "
                f"apply_plan(..., compile_backend='aot_eager') aligns the traced ops, measure_steps measures the "
                f"compiled step's real peak")
    return (f"inductor, {kept}; outside checkpointed modules AOT's partitioner may keep less than counted, and "
            f"fused kernels change what is kept; checked: apply_plan(..., "
            f"compile_backend='inductor') aligns the traced ops, not the peak (its buffers are not seen here)")


def _scope(s: Any) -> str:
    return sharding_scope(s.metadata.sharding)


def _modules_text(result: Any) -> str:
    s = result.stats
    text = f"{len(s.modules)} that run ({sum(m.ops is not None for m in s.modules)} with op lists)"
    left_out = s.metadata.tags.get(LEFT_OUT_TAG)
    silent = result.model_module_count - len(s.modules) - (len(left_out.split(",")) if left_out else 0)
    if silent > 0:
        text += f"; {silent} more in the model never ran on their own (containers such as ModuleList)"
    return text


def guidance_rows(g: Guidance) -> list[tuple[str, str]]:
    """Rows saying whether the step fits, which budgets have plans and what to run next."""
    rows = [(f"{g.device} holds", _device_text(g))]
    if g.device_bytes is not None:
        rows.append(("fits as is", _fits_as_is_text(g)))
        if not g.fits_as_is:
            rows.append(("fits with checkpointing", _fits_with_plan_text(g)))
        if g.world_size > 1 or not g.fits_with_plan:
            rows.append(("sharded", _sharded_text(g)))
    else:
        rows.append(("smallest budget", f"{g.min_budget_gib:g} GiB has a plan ({g.scope})"))
    splits = g.splits or [None] * len(g.suggestions)
    for k, (p, split) in enumerate(zip(g.suggestions, splits)):
        rows.append(("suggested budgets" if k == 0 else "", _suggestion_text(p, split)))
    if any(split is not None and split.overhead_dominates for split in splits):
        rows.append(("host overhead", HOST_OVERHEAD_NOTE))
    rows += _next_rows(g)
    return rows


def _next_rows(g: Guidance) -> list[tuple[str, str]]:
    """The command worth running: a plan that checkpoints something, or nothing when the step fits as is."""
    if g.device_bytes is not None and g.sharded_min_budget_gib * GIB > g.device_bytes:
        return [("or", "collect again with a smaller --batch or --seq")]  # nothing fits, however sharded
    sharded = f" over --world-size {g.world_size}" if g.world_size > 1 else ""
    if g.fits_without_plan:
        rows = [("next", f"nothing to plan: the step fits {g.device}{sharded} without checkpointing")]
        if g.next_command:
            rows.append(("to free memory", f"{g.next_command}  (e.g. for a larger --batch or --seq)"))
        return rows
    if g.next_command is None:
        if g.sharded_min_budget_gib * GIB >= g.sharded_baseline_bytes * (1 - 1e-5):  # the minimum is rounded up
            return [("next", "nothing to plan: checkpointing lowers no peak of this step (the smallest budget with "
                             "a plan is its peak without checkpointing)")]
        return [("next", "nothing to plan: no budget above needs checkpointing")]
    rows = [("next", g.next_command)]
    if g.world_size > 1:
        rows.append(("or", "collect again with a smaller --batch or --seq"))
    return rows


def _device_text(g: Guidance) -> str:
    if g.device_bytes is None:
        return "no fixed memory in the device table: budgets below run from the smallest with a plan"
    return f"{g.device_bytes / 10**9:g} GB = {size_text(g.device_bytes)} (the datasheet's GB are 10^9 bytes)"


def _fits_as_is_text(g: Guidance) -> str:
    verdict = "yes" if g.fits_as_is else "no"
    return f"{verdict}: {size_text(g.baseline_bytes)} without checkpointing ({g.scope})"


def _fits_with_plan_text(g: Guidance) -> str:
    if g.fits_with_plan:
        return f"yes: the smallest budget with a plan is {g.min_budget_gib:g} GiB ({g.scope})"
    return (f"no: the smallest budget with a plan is {g.min_budget_gib:g} GiB ({g.scope}), "
            f"above the {size_text(g.device_bytes)} the device holds")


def _sharded_text(g: Guidance) -> str:
    if g.sharded_min_budget_gib * GIB > g.device_bytes:
        return (f"even with --world-size {WORLD_SIZES[-1]} the smallest budget with a plan is "
                f"{g.sharded_min_budget_gib:g} GiB: nothing fits this device")
    verdict = "fits as is" if g.sharded_baseline_bytes <= g.device_bytes else "fits with checkpointing"
    return (f"with --world-size {g.world_size} (parameters, gradients and optimizer state sharded over "
            f"{g.world_size} ranks, e.g. FSDP): {verdict}; no checkpointing {size_text(g.sharded_baseline_bytes)}, "
            f"smallest budget with a plan {g.sharded_min_budget_gib:g} GiB")


def _suggestion_text(p: Plan, split: RecomputeSplit | None) -> str:
    head = f"{p.memory_budget_gib:g} GiB"
    if p.status not in ("optimal", "feasible"):
        return f"{head}: {p.status}"
    if not p.modules:
        return f"{head}: no checkpointing needed"
    recompute = split.short_text() if split is not None else f"{p.recompute_ms:.1f} ms"
    n = len(p.modules)
    return (f"{head}: recompute {recompute}, {n} module{'s' if n != 1 else ''} checkpointed"
            + (f" ({p.status})" if p.status != "optimal" else ""))


def size_text(n: float) -> str:
    """Bytes in the largest binary unit that keeps the figure at least 1."""
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"

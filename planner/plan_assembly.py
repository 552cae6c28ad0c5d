"""A plan as the user reads it (:class:`planner.Plan`), assembled from an engine's answer.

The checkpointed modules with their save lists and figures, the step's memory
at every key moment without and with the plan, and the message an infeasible
budget gets. What does not depend on the budget (the moments' fields, a module's
op names) is worked out once per problem, or once per plan for modules with the
same ops: a 405B step has 2657 moments and 126 checkpointed layers per plan.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from planner.memory_model import compute_ms, discardable_bytes
from planner.options import PlanOptions
from planner.plan_format import OffloadWindow, Plan, PlannedModule
from planner.solve.offload import OffloadPlan, host_link, offload_plan, offload_setup
from planner.solve.problem import Candidate, Problem
from planner.solve.solution import Decision, Solution, discards, save_lists
from planner.version import PLANNER_VERSION

__all__ = ["to_plan"]


def to_plan(prob: Problem, sol: Solution, budget: float, opts: PlanOptions, baseline: int,
            seconds: float, min_budget: float | None) -> Plan:
    """One budget's :class:`planner.Plan` from the engine's answer: its modules, timeline and figures."""
    modules = _planned_modules(prob, sol.decisions, sol.offload)
    recompute_ms = sol.recompute_ms
    if recompute_ms is not None and modules:
        recompute_ms = math.fsum(pm.recompute_ms for pm in modules)
    message = sol.message
    if sol.status == "infeasible" and min_budget is not None:
        message = f"no plan fits {budget:g} GiB; the smallest budget with a plan is {min_budget:g} GiB"
        if not prob.candidates:
            message += (" (no module can be checkpointed: that takes a non-leaf module with op stats, other than "
                        "the root, that frees memory, is among ac_units when given and encloses no FSDP unit)")
    return Plan(
        status=sol.status,
        message=message,
        memory_budget_gib=budget,
        world_size=opts.world_size,
        peak_bytes=None if sol.peak_bytes is None else int(math.ceil(sol.peak_bytes)),
        recompute_ms=recompute_ms,
        baseline_peak_bytes=baseline,
        compute_ms=compute_ms(prob.stats),
        solve_seconds=seconds,
        mip_gap=sol.mip_gap,
        planner_version=PLANNER_VERSION,
        min_feasible_budget_gib=min_budget,
        memory_model=prob.model.kind,
        memory_model_note=prob.model.note,
        first_step_only=opts.first_step_only,
        modules=modules,
        **_timeline(prob, sol),
        **_accumulation(prob, recompute_ms),
        **(_offload_fields(prob, sol, opts, recompute_ms) if opts.offload == "on" else {}),
    )


def _offload_fields(prob: Problem, sol: Solution, opts: PlanOptions, recompute_ms: float | None) -> dict:
    """With offload on: the link, and for a plan its windows, host memory, stall and overall overhead."""
    setup = offload_setup(prob, host_link(prob.stats, opts.host_link_gbps))
    link = setup.windows.link
    out: dict[str, Any] = {"offload": "on", "host_link_gbps": {"d2h": link.d2h_gbps, "h2d": link.h2d_gbps}}
    if sol.decisions is None or recompute_ms is None:
        return out
    off = sol.offload if sol.offload is not None else offload_plan(prob, setup.windows, {})
    return {**out, "host_bytes": off.host_bytes, "offload_stall_ms": off.stall_ms,
            "step_overhead_ms": recompute_ms + off.stall_ms, "offload_windows": _windows(off),
            "prefetch_distance": 1}


def _windows(off: OffloadPlan) -> list[OffloadWindow]:
    w = off.windows
    out = []
    for j, nbytes in enumerate(off.window_bytes.tolist()):
        d2h, h2d = w.copy_ms(nbytes)
        fw, bw = w.hidden_ms(j)
        out.append(OffloadWindow(index=j, end_module=w.end_modules[j], offloaded_bytes=int(nbytes), d2h_ms=d2h,
                                 forward_ms=fw, h2d_ms=h2d, backward_ms=bw, stall_ms=float(off.window_stall_ms[j])))
    return out


def _accumulation(prob: Problem, recompute_ms: float | None) -> dict:
    """With gradient accumulation: the micro-batches and the recompute of a whole optimizer step."""
    n = prob.model.grad_accumulation if prob.model.grad_accumulation > 1 else prob.stats.metadata.grad_accumulation
    if not n:
        return {}
    return {"grad_accumulation": n,
            "recompute_ms_per_optimizer_step": None if recompute_ms is None else recompute_ms * n}


def _timeline(prob: Problem, sol: Solution) -> dict:
    """The plan's ``timeline`` and ``peak_at``: every key moment without and with the plan."""
    model = prob.model
    base, fixed = prob.derived("plan_moments", _moments_without_plan)
    planned = None
    if sol.decisions is not None:
        planned = sol.profile if sol.profile is not None else \
            model.profile_bytes(discards(prob, sol.decisions), saves=save_lists(sol.decisions),
                                offloaded=None if sol.offload is None else sol.offload.credits)
    shown = planned if planned is not None else base
    # whole bytes as math.ceil gives them (every figure is far below 2**63); the moments as dicts, validated by the
    # plan in one go: a 405B timeline has 2657 of them
    if planned is None:
        moments = [{**m, "planned_bytes": None} for m in fixed]
    else:
        moments = [{**m, "planned_bytes": b} for m, b in zip(fixed, np.ceil(planned).astype(np.int64).tolist())]
    peak = int(shown.argmax())
    micro = model.micro_batches or (None,) * len(base)
    return {"timeline": moments, "peak_at": model.describe(peak), "peak_micro_batch": micro[peak]}


def _moments_without_plan(prob: Problem) -> tuple[np.ndarray, list[dict]]:
    """The step's memory per moment without a plan, and each moment's fields but its planned bytes (shared by a
    sweep's plans)."""
    model = prob.model
    base = model.profile_bytes()
    micro = model.micro_batches or (None,) * len(base)
    fixed = [{"phase": phase, "module": module, "baseline_bytes": b, "micro_batch": mb}
             for phase, module, b, mb in zip(model.phases, model.modules, np.ceil(base).astype(np.int64).tolist(),
                                             micro)]
    return base, fixed


def _planned_modules(prob: Problem, decisions: dict[str, Decision] | None,
                     offload: OffloadPlan | None = None) -> list[PlannedModule]:
    """The checkpointed modules in forward pre-order. Modules with the same ops (one op-classes object) share
    their op names, bytes and, for the same save list object, their recompute: worked out once."""
    if not decisions:
        return []
    cand_of = prob.derived("candidate_of", lambda p: {c.fqn: c for c in p.candidates})
    same: dict[tuple, Any] = {}
    out = [_planned_module(prob, fqn, decisions[fqn], cand_of.get(fqn), same) for fqn in prob.stats.fw_pre_order
           if fqn in decisions]
    if offload is not None:  # the modules that offload: their lists and bytes
        out = [pm if pm.fqn not in offload.modules else
               pm.model_copy(update={"offload": offload.modules[pm.fqn],
                                     "offloaded_bytes": offload.module_bytes[pm.fqn],
                                     "offload_calls": offload.calls.get(pm.fqn)}) for pm in out]
    return out


def _planned_module(prob: Problem, fqn: str, decision: Decision, cand: Candidate | None,
                    same: dict[tuple, Any]) -> PlannedModule:
    save, saved_bytes, _ = decision
    m = prob.stats.module(fqn)
    overhead = m.checkpoint_overhead_ms or 0.0
    ops = None if cand is None else id(cand.classes)
    shared = None if ops is None else same.get(ops)
    if shared is None:
        shared = (m.op_bytes, [op.name for op in m.ops])
        if ops is not None:
            same[ops] = shared
    total, names = shared
    key = None if ops is None else (ops, id(save), overhead, m.calls)
    recompute = same.get(key) if key is not None else None
    if recompute is None:
        # summed from the save list itself (not total - saved: that leaves float noise where nothing is recomputed)
        recompute = math.fsum([ms for ms, s in zip(m.recompute_runtimes_ms, save) if not s] + [overhead]) * m.calls
        if key is not None:
            same[key] = recompute
    return PlannedModule(
        fqn=fqn,
        discard_ratio=1.0 - saved_bytes / total if total else 0.0,
        discarded_bytes=discardable_bytes(m) - saved_bytes,
        saved_bytes=saved_bytes,
        recompute_ms=recompute,
        checkpoint_overhead_ms=overhead,
        save=save,
        op_names=names,
    )

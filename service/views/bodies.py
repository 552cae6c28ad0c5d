"""Stored rows as response bodies, written once for the routes and for the OpenAPI examples."""

from __future__ import annotations

import json

from datetime import datetime
from typing import Any

from planner import GIB, Plan, Stats, pipeline_plan_of
from planner.stats.pipeline import PipelineStageInfo
from service.schemas import PipelinePlanOut, PlanOut, PlanSummary, StatsSummary, SweepOut, SweepPoint
from service.store import CachedPlan, PlanRecord, StatsRecord, SweepRecord

__all__ = ["stats_summary", "module_tree_json", "plan_summary", "sweep_point", "sweep_out", "pipeline_plan_out"]


def stats_summary(row: StatsRecord) -> StatsSummary:
    """An upload as listed: what it is and what the step costs without checkpointing."""
    return StatsSummary(
        id=row.id, model_name=row.model_name, content_hash=row.content_hash, source_format=row.source_format,
        module_count=row.module_count, op_count=row.op_count, baseline_peak_bytes=row.baseline_peak_bytes,
        baseline_peak_gib=row.baseline_peak_bytes / GIB, compute_ms=row.compute_ms,
        tags={t.key: t.value for t in row.tags}, created_at=row.created_at,
    )


def module_tree_json(stats: Stats) -> str:
    """The module tree of ``stats`` as ``ModuleNode`` JSON, children in execution order.

    Written without recursion: the stats format allows trees 512 levels deep,
    past what recursive serializers take (pydantic stops at 255 levels).
    """
    children: dict[str, list[str]] = {m.fqn: [] for m in stats.modules}
    for fqn in stats.fw_pre_order:  # pre-order keeps children in execution order
        parent = stats.module(fqn).parent
        if parent is not None:
            children[parent].append(fqn)
    out: list[str] = []
    # The stack holds modules to open, or the text that closes one.
    stack: list[str | tuple[str, bool]] = [(stats.root.fqn, True)]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
            continue
        fqn, first = item
        m = stats.module(fqn)
        node = {"fqn": m.fqn, "is_leaf": m.is_leaf, "op_count": None if m.ops is None else len(m.ops),
                "act_saved_bytes": m.act_saved_bytes, "fw_ms": m.fw_ms, "bw_ms": m.bw_ms}
        out.append(("" if first else ",") + json.dumps(node, separators=(",", ":"))[:-1] + ',"children":[')
        stack.append("]}")
        stack.extend((c, k == 0) for k, c in reversed(list(enumerate(children[fqn]))))
    return "".join(out)


def plan_summary(r: PlanRecord) -> PlanSummary:
    """A stored plan as listed under its stats."""
    return PlanSummary(id=r.id, stats_id=r.stats_id, memory_budget_gib=r.memory_budget_gib, world_size=r.world_size,
                       status=r.status, peak_bytes=r.peak_bytes, recompute_ms=r.recompute_ms,
                       solve_seconds=r.solve_seconds, planner_version=r.planner_version, created_at=r.created_at)


def sweep_point(p: CachedPlan) -> SweepPoint:
    """One budget of a sweep: its plan's outcome."""
    plan = p.plan()
    return SweepPoint(plan_id=p.id, memory_budget_gib=plan["memory_budget_gib"], status=plan["status"],
                      peak_bytes=plan.get("peak_bytes"), recompute_ms=plan.get("recompute_ms"),
                      min_feasible_budget_gib=plan.get("min_feasible_budget_gib"), cached=p.cached,
                      step_overhead_ms=plan.get("step_overhead_ms"), offload_stall_ms=plan.get("offload_stall_ms"),
                      host_bytes=plan.get("host_bytes"))


def sweep_out(row: SweepRecord, stats: StatsRecord, points: list[SweepPoint], cached: bool) -> SweepOut:
    """A stored sweep with its points."""
    return SweepOut(id=row.id, stats_id=row.stats_id, cached=cached, created_at=row.created_at,
                    baseline_peak_bytes=stats.baseline_peak_bytes, compute_ms=stats.compute_ms, points=points,
                    chart_url=f"/v1/sweeps/{row.id}/chart.png")


def pipeline_plan_out(pipeline_plan_id: str | None, created_at: datetime | None, stats_ids: list[str],
                      info: PipelineStageInfo, compute_ms: list[float], plans: list[CachedPlan],
                      memory_budget_gib: float, *, cached: bool) -> PipelinePlanOut:
    """A pipeline plan from its stage plans (in stage order) and the stages' compute: the planner's answer
    (:func:`planner.pipeline_plan_of`) with each stage's plan as served and the bundle's id."""
    answer = pipeline_plan_of(info, compute_ms, [Plan.model_validate(p.plan()) for p in plans], memory_budget_gib)
    stages = [PlanOut(**_plan_fields(p), id=p.id, stats_id=p.stats_id, cached=p.cached, created_at=p.created_at,
                      request=p.request) for p in plans]
    return PipelinePlanOut(**{**answer.model_dump(), "stages": stages}, id=pipeline_plan_id, stats_ids=stats_ids,
                           cached=cached, created_at=created_at,
                           chart_url=None if pipeline_plan_id is None else f"/v1/pipeline-plans/{pipeline_plan_id}/chart.png")


def _plan_fields(p: CachedPlan) -> dict[str, Any]:
    return {k: v for k, v in p.plan().items() if k not in ("id", "stats_id", "cached", "created_at", "request")}

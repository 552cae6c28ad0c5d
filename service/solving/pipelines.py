"""Every stage of a pipeline planned under one budget, each stage's plan cached or solved once as any plan is.

The request names the stages' uploads; they are checked to be stages 0..S-1 of
one pipeline (the same stages, schedule and microbatches; each stage once)
before anything is solved, each refusal a 422 naming ``stats_ids[k]`` and its
id. Then each stage goes through :func:`~service.solving.plans.cached_or_solved`
and the planner's :func:`planner.pipeline_plan_of` makes the pipeline's answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from planner.stats.pipeline import PipelineStageInfo
from service.config import Settings
from service.errors import InvalidInput, NotFound
from service.schemas import PipelinePlanRequest
from service.solving.plans import cached_or_solved
from service.solving.pool import SolverPool
from service.store import CachedPlan, StatsRecord, is_id, shown_id
from service.transport import check_time_limit

__all__ = ["PipelineStages", "pipeline_plans_for", "pipeline_info"]


@dataclass(frozen=True)
class PipelineStages:
    """The request's uploads in stage order: their ids, pipeline metadata and compute time (forward + backward)."""

    stats_ids: list[str]
    infos: list[PipelineStageInfo]
    compute_ms: list[float]


async def pipeline_plans_for(factory: sessionmaker[Session], pool: SolverPool, settings: Settings, project: str,
                             request: PipelinePlanRequest, *,
                             started: float) -> tuple[PipelineStages, list[CachedPlan]]:
    """The request's stages (checked, in stage order) and one plan per stage at its budget: cached, or solved."""
    check_time_limit(request.time_limit_s, settings.max_time_limit_s)
    stages = await run_in_threadpool(_stages, factory, project, request.stats_ids)
    plans = []
    for stats_id in stages.stats_ids:  # one after another: a request holds one solver slot of its project at a time
        plans += await cached_or_solved(factory, pool, project, stats_id, [request.memory_budget_gib], request,
                                        started=started)
    return stages, plans


def _refusal(k: int, stats_id: str, message: str) -> InvalidInput:
    message = f"stats_ids[{k}] {shown_id(stats_id)}: {message}"
    return InvalidInput(message, errors=[{"loc": ["body", "stats_ids", str(k)], "msg": message, "input": stats_id}])


def _stages(factory: sessionmaker[Session], project: str, stats_ids: list[str]) -> PipelineStages:
    """The uploads as stages of one pipeline, in stage order; 404 for an unknown id, 422 for one that does not fit."""
    infos, compute = [], []
    with factory() as session:
        for k, stats_id in enumerate(stats_ids):
            row = session.execute(select(StatsRecord.document, StatsRecord.compute_ms).where(
                StatsRecord.id == stats_id, StatsRecord.project == project)).first() if is_id(stats_id) else None
            if row is None:
                raise NotFound(f"stats_ids[{k}] {shown_id(stats_id)} does not exist")
            infos.append(_stage_info(k, stats_id, row.document))
            compute.append(row.compute_ms)
    first = infos[0]
    for k, info in enumerate(infos):
        for name in ("stages", "schedule", "microbatches", "virtual_stages"):
            if getattr(info, name) != getattr(first, name):
                raise _refusal(k, stats_ids[k], f"pipeline.{name} {getattr(info, name)!r} differs from stats_ids[0]'s "
                                                f"{getattr(first, name)!r}: give the stages of one collection")
    seen: dict[int, int] = {}
    for k, info in enumerate(infos):
        if info.stage in seen:
            raise _refusal(k, stats_ids[k], f"stage {info.stage} again (stats_ids[{seen[info.stage]}] is stage "
                                            f"{info.stage} too): give each stage once")
        seen[info.stage] = k
    missing = [s for s in range(first.stages) if s not in seen]
    if missing:
        message = (f"stats_ids name stages {sorted(seen)} of a {first.stages}-stage pipeline; stage{'s' * (len(missing) > 1)} "
                   f"{', '.join(map(str, missing))} missing")
        raise InvalidInput(message, errors=[{"loc": ["body", "stats_ids"], "msg": message, "input": stats_ids}])
    order = [seen[s] for s in range(first.stages)]
    return PipelineStages([stats_ids[k] for k in order], [infos[k] for k in order], [compute[k] for k in order])


def pipeline_info(stats_id: str, document: str) -> PipelineStageInfo:
    """A stored upload's ``metadata.pipeline``; 422 when it has none."""
    return _stage_info(0, stats_id, document)


def _stage_info(k: int, stats_id: str, document: str) -> PipelineStageInfo:
    """The upload's ``metadata.pipeline`` (its document was validated on upload)."""
    pipeline = (json.loads(document).get("metadata") or {}).get("pipeline")
    if pipeline is None:
        raise _refusal(k, stats_id, "is not a pipeline stage's stats (no metadata.pipeline): collect with --pp-stages")
    try:
        return PipelineStageInfo.model_validate(pipeline)
    except ValidationError as exc:  # stored by an older planner: say what this one refuses
        raise _refusal(k, stats_id, f"metadata.pipeline: {exc.errors()[0]['msg']}") from None

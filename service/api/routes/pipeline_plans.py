"""Pipeline plans: every stage of a pipeline under one budget, each stage a cached plan; read; chart."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response, status
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from service.api.deps import IdPath, ProjectDep, RendererDep, SessionFactoryDep, SettingsDep, SolverDep
from service.api.responses import NOT_FOUND, PIPELINE_FROM_CACHE, PNG, RENDER_BUSY, SOLVE_ERRORS
from service.schemas import PipelinePlanOut, PipelinePlanRequest
from service.solving import pipeline_info, pipeline_plans_for
from service.store import get_pipeline_plan, keep_pipeline_plan
from service.times import iso_utc
from service.transport import arrived_at
from service.views import pipeline_chart_job, pipeline_plan_out

router = APIRouter(prefix="/v1/pipeline-plans", tags=["pipeline-plans"])


@router.post("", response_model=PipelinePlanOut, status_code=status.HTTP_201_CREATED,
             responses={**PIPELINE_FROM_CACHE, **SOLVE_ERRORS})
async def create_pipeline_plan(
    body: PipelinePlanRequest, project: ProjectDep, settings: SettingsDep, factory: SessionFactoryDep,
    solver: SolverDep, request: Request, response: Response,
) -> PipelinePlanOut:
    """Plan every stage of a pipeline under one budget: each stage's plan cached or solved, the pipeline's step
    predicted; stored (201), or the same as before (200).

    Name every stage's stats upload in ``stats_ids`` (stages 0..S-1 of one ``sacplan collect --pp-stages S``).
    ``time_limit_s`` is for the whole request.
    """
    started = arrived_at(request.scope) or time.monotonic()
    stages, plans = await pipeline_plans_for(factory, solver, settings, project, body, started=started)
    budget = body.memory_budget_gib
    if any(p.id is None for p in plans):  # a solver error: answer, but store no pipeline plan of it
        response.status_code = status.HTTP_200_OK
        return pipeline_plan_out(None, None, stages.stats_ids, stages.infos[0], stages.compute_ms, plans, budget,
                                 cached=False)
    fields = {**body.cache_fields(), "memory_budget_gib": budget}
    row, inserted = await run_in_threadpool(keep_pipeline_plan, factory, project, stages.stats_ids, fields, plans)
    if not inserted:
        response.status_code = status.HTTP_200_OK
    return pipeline_plan_out(row.id, row.created_at, row.stats_ids, stages.infos[0], stages.compute_ms, plans, budget,
                             cached=all(p.cached for p in plans))


@router.get("/{pipeline_plan_id}", response_model=PipelinePlanOut, responses=NOT_FOUND)
async def read_pipeline_plan(pipeline_plan_id: IdPath, project: ProjectDep,
                             factory: SessionFactoryDep) -> PipelinePlanOut:
    """A stored pipeline plan."""
    return await run_in_threadpool(_stored, factory, project, pipeline_plan_id)


@router.get("/{pipeline_plan_id}/chart.png", response_class=Response, responses={**PNG, **NOT_FOUND, **RENDER_BUSY})
async def pipeline_plan_chart(pipeline_plan_id: IdPath, project: ProjectDep, factory: SessionFactoryDep,
                              renderer: RendererDep) -> Response:
    """Every stage's peak without and with its plan against the budget, the microbatches each holds at once."""
    out, model_name = await run_in_threadpool(_stored_and_model, factory, project, pipeline_plan_id)
    key = ("pipeline", out.id, iso_utc(out.created_at))
    png = await renderer.chart(key, pipeline_chart_job, model_name, out.model_dump_json())
    return Response(png, media_type="image/png")


def _stored(factory: sessionmaker[Session], project: str, pipeline_plan_id: str) -> PipelinePlanOut:
    return _stored_and_model(factory, project, pipeline_plan_id)[0]


def _stored_and_model(factory: sessionmaker[Session], project: str,
                      pipeline_plan_id: str) -> tuple[PipelinePlanOut, str]:
    with factory() as session:
        row, plans, stats = get_pipeline_plan(session, project, pipeline_plan_id)
        info = pipeline_info(row.stats_ids[0], stats[0].document)
    out = pipeline_plan_out(row.id, row.created_at, row.stats_ids, info, [s.compute_ms for s in stats], plans,
                            row.request["memory_budget_gib"], cached=True)
    return out, stats[0].model_name


__all__ = ["router"]

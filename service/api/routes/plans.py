"""Plans: solve-or-serve-cached, read, chart."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from service.api.deps import IdPath, ProjectDep, RendererDep, SessionFactoryDep, SettingsDep, SolverDep
from service.api.inline import arrival_and_body, plan_not_in_time
from service.api.responses import NOT_FOUND, PLAN_FROM_CACHE, PNG, RENDER_BUSY, SOLVE_ERRORS, STALE_STATS
from service.schemas import PlanOut, PlanRequest
from service.solving import plans_for
from service.store import CachedPlan, StatsNotInTime, get_plan, get_stats, plan_json
from service.times import iso_utc
from service.transport import deferred_body_route
from service.views import plan_chart_job, raise_if_stale

# A body over a MiB (inline stats) is parsed and validated in a render process, as an upload is; the route sees
# the placeholder, and reads the request itself through service.api.deps.request_body.
router = APIRouter(prefix="/v1/plans", tags=["plans"], route_class=deferred_body_route({"stats_id": "deferred", "memory_budget_gib": 1.0}))


def plan_response(plan: CachedPlan) -> Response:
    """The plan as stored (no re-validation on the hot path): 201 when this request stored it, else 200."""
    created = plan.id is not None and not plan.cached
    return Response(plan_json(plan), media_type="application/json",
                    status_code=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
                    headers={"X-Cache": "hit" if plan.cached else "miss"})


@router.post("", response_model=PlanOut, status_code=status.HTTP_201_CREATED,
             responses={**PLAN_FROM_CACHE, **SOLVE_ERRORS})
async def create_plan(
    body: PlanRequest, project: ProjectDep, settings: SettingsDep, factory: SessionFactoryDep, solver: SolverDep,
    renderer: RendererDep, request: Request,
) -> Response:
    """Plan one budget: solved now and stored (201), or from the cache (200, ``cached: true``, no solve).

    Name the stats by ``stats_id``, or send them inline as ``stats`` (stored as ``POST /v1/stats`` would).
    """
    # time_limit_s counts from the request's arrival: reading, validating and storing inline stats included
    try:
        started, body = await arrival_and_body(request, body, factory, renderer, settings, project)
    except StatsNotInTime as late:  # nothing stored: answered at the limit
        return plan_not_in_time(late.request)
    _, [plan] = await plans_for(factory, solver, settings, project, body, [body.memory_budget_gib], started=started)
    return plan_response(plan)


@router.get("/{plan_id}", response_model=PlanOut, responses=NOT_FOUND)
async def read_plan(plan_id: IdPath, project: ProjectDep, factory: SessionFactoryDep) -> Response:
    """A stored plan."""
    # One primary-key read, on the event loop: a thread hop costs more than the
    # query (and SQLite WAL readers never wait for writers).
    with factory() as session:
        return plan_response(CachedPlan.of(get_plan(session, project, plan_id), cached=True))


@router.get("/{plan_id}/chart.png", response_class=Response,
            responses={**PNG, **NOT_FOUND, **STALE_STATS, **RENDER_BUSY})
async def plan_chart(plan_id: IdPath, project: ProjectDep, factory: SessionFactoryDep,
                     renderer: RendererDep) -> Response:
    """Memory per module across the step, without and with the plan, and the budget line."""
    plan, document = await run_in_threadpool(_plan_and_document, factory, project, plan_id)
    key = ("plan", plan.id, iso_utc(plan.created_at))
    png = raise_if_stale(await renderer.chart(key, plan_chart_job, plan.stats_id, document, plan.result))
    return Response(png, media_type="image/png")


def _plan_and_document(factory: sessionmaker[Session], project: str, plan_id: str) -> tuple[CachedPlan, str]:
    with factory() as session:
        plan = CachedPlan.of(get_plan(session, project, plan_id), cached=True)
        return plan, get_stats(session, project, plan.stats_id).document


__all__ = ["router"]

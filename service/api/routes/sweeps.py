"""Sweeps: plans at many budgets (the recompute-vs-memory Pareto curve), each point a cached plan."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request, Response, status
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from service.api.deps import IdPath, ProjectDep, RendererDep, SessionDep, SessionFactoryDep, SettingsDep, SolverDep
from service.api.inline import arrival_and_body, sweep_not_in_time
from service.api.responses import NOT_FOUND, PNG, RENDER_BUSY, SOLVE_ERRORS, SWEEP_FROM_CACHE
from service.errors import ServiceError
from service.schemas import SweepOut, SweepRequest
from service.solving import SolverPool, cached_or_solved, plans_for
from service.store import (CachedPlan, StatsNotInTime, StatsRecord, SweepRecord, find_plans, get_stats, get_sweep,
                           keep_sweep)
from service.times import iso_utc
from service.transport import deferred_body_route
from service.views import sweep_chart_job, sweep_out, sweep_point

log = logging.getLogger(__name__)

# A body over a MiB (inline stats) is parsed and validated in a render process, as an upload is; the route sees
# the placeholder, and reads the request itself through service.api.deps.request_body.
router = APIRouter(prefix="/v1/sweeps", tags=["sweeps"], route_class=deferred_body_route({"stats_id": "deferred", "budgets_gib": [1.0]}))


@router.post("", response_model=SweepOut, status_code=status.HTTP_201_CREATED,
             responses={**SWEEP_FROM_CACHE, **SOLVE_ERRORS})
async def create_sweep(
    body: SweepRequest, project: ProjectDep, settings: SettingsDep, factory: SessionFactoryDep, solver: SolverDep,
    renderer: RendererDep, request: Request, response: Response,
) -> SweepOut:
    """Plans at each budget (missing ones solved in one job), stored as a new sweep (201) or the same as
    before (200); the curve is also a chart. With offload='on' the same budgets are also planned without
    offloading (cached, or solved within the same time limit), for the chart's second curve."""
    # one time_limit_s for the whole sweep, from the request's arrival (inline stats read off the event loop)
    try:
        started, body = await arrival_and_body(request, body, factory, renderer, settings, project)
    except StatsNotInTime as late:  # nothing stored: answered at the limit
        response.status_code = status.HTTP_200_OK
        return sweep_not_in_time(late.request)
    budgets = body.budgets()
    stats_id, plans = await plans_for(factory, solver, settings, project, body, budgets, started=started)
    points = [sweep_point(p) for p in plans]
    if any(p.id is None for p in plans):  # a solver error: answer, but store no sweep of it
        response.status_code = status.HTTP_200_OK
        stats = await run_in_threadpool(lambda: _stats_row(factory, project, stats_id))
        return SweepOut(id=None, stats_id=stats_id, cached=False, created_at=stats.created_at,
                        baseline_peak_bytes=stats.baseline_peak_bytes, compute_ms=stats.compute_ms,
                        points=points, chart_url=None)
    if body.offload == "on":  # the chart's other curve: the same budgets without offloading, cached or solved
        await _plan_without_offload(factory, solver, project, stats_id, budgets, body, started)
    request = {**body.cache_fields(), "budgets_gib": budgets}
    row, stats, inserted = await run_in_threadpool(keep_sweep, factory, project, stats_id, request, plans)
    if not inserted:
        response.status_code = status.HTTP_200_OK
    return sweep_out(row, stats, points, cached=all(p.cached for p in plans))


def _stats_row(factory: sessionmaker[Session], project: str, stats_id: str) -> StatsRecord:
    with factory() as session:
        return get_stats(session, project, stats_id)


@router.get("/{sweep_id}", response_model=SweepOut, responses=NOT_FOUND)
def read_sweep(sweep_id: IdPath, project: ProjectDep, session: SessionDep) -> SweepOut:
    """A stored sweep."""
    row, stats, plans = get_sweep(session, project, sweep_id)
    return sweep_out(row, stats, [sweep_point(p) for p in plans], cached=True)


@router.get("/{sweep_id}/chart.png", response_class=Response, responses={**PNG, **NOT_FOUND, **RENDER_BUSY})
async def sweep_chart(sweep_id: IdPath, project: ProjectDep, factory: SessionFactoryDep,
                      renderer: RendererDep) -> Response:
    """Recompute time against memory budget for the sweep's points (with offload='on': recompute + stall, beside
    the plans without offloading)."""
    row, stats, plans, without = await run_in_threadpool(_sweep_with, factory, project, sweep_id)
    key = ("sweep", row.id, iso_utc(row.created_at), len(without))  # a twin solved later redraws it
    png = await renderer.chart(key, sweep_chart_job, stats.model_name, [p.result for p in plans],
                               stats.baseline_peak_bytes, [p.result for p in without])
    return Response(png, media_type="image/png")


# the request fields only plans with offload on read: the sweep's second curve plans without them
_OFFLOAD_ONLY = ("host_link_gbps", "host_budget_gib")


async def _plan_without_offload(factory: sessionmaker[Session], solver: SolverPool, project: str, stats_id: str,
                                budgets: list[float], body: SweepRequest, started: float) -> None:
    """Plan ``budgets`` as ``body`` asks but without offloading, into the plan cache (the sweep's chart reads them
    there). Best effort: the sweep is answered whole without them; a busy pool or a spent time limit leaves the
    chart's second curve short, and says so in the log."""
    try:
        await cached_or_solved(factory, solver, project, stats_id, budgets,
                               body.model_copy(update={"offload": "off", **dict.fromkeys(_OFFLOAD_ONLY)}),
                               started=started)
    except ServiceError as exc:
        log.info("sweep of stats %s: the plans without offloading were not made (%s)", stats_id, exc)


def _sweep_with(factory: sessionmaker[Session], project: str,
                sweep_id: str) -> tuple[SweepRecord, StatsRecord, list[CachedPlan], list[CachedPlan]]:
    """The sweep, its stats and plans, and with offload='on' the cached plans of its budgets without offloading
    (those there are: a time limit may have left some unsolved)."""
    with factory() as session:
        row, stats, plans = get_sweep(session, project, sweep_id)
        if row.request.get("offload") != "on":
            return row, stats, plans, []
        fields = {k: v for k, v in row.request.items() if k not in ("offload", *_OFFLOAD_ONLY, "budgets_gib")}
        _, found = find_plans(session, project, row.stats_id, fields, row.request["budgets_gib"])
        return row, stats, plans, list(found.values())

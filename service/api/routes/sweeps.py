"""Sweeps: plans at many budgets (the recompute-vs-memory Pareto curve), each point a cached plan."""

from __future__ import annotations

import hashlib
import time
from typing import Any

from fastapi import APIRouter, Response, status
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from service.api.deps import IdPath, ProjectDep, RendererDep, SessionDep, SessionFactoryDep, SettingsDep, SolverDep
from service.api.responses import NOT_FOUND, PNG, RENDER_BUSY, SOLVE_ERRORS, SWEEP_FROM_CACHE
from service.cache import CachedPlan, get_stats, plans_for
from service.db import insert_or_get, write_gate
from service.errors import NotFound
from service.ids import is_id
from service.limits import UploadLimits, check_time_limit
from service.models import PlanRecord, StatsRecord, SweepRecord
from service.rendering import sweep_chart_job
from service.schemas import SweepOut, SweepRequest
from service.times import iso_utc
from service.uploads import stats_id_of
from service.views import sweep_out, sweep_point

router = APIRouter(prefix="/v1/sweeps", tags=["sweeps"])


def _record(factory: sessionmaker[Session], project: str, stats_id: str, request: dict[str, Any],
            plans: list[CachedPlan]) -> tuple[SweepRecord, StatsRecord, bool]:
    """The sweep of these plans, stored now unless it already was; and whether this call stored it."""
    plan_ids = [p.id for p in plans]
    key = hashlib.sha256(",".join(str(i) for i in plan_ids).encode()).hexdigest()
    with write_gate(factory), factory() as session:
        stats = get_stats(session, project, stats_id)
        find = select(SweepRecord).where(SweepRecord.stats_id == stats_id, SweepRecord.cache_key == key)
        row = session.execute(find).scalar_one_or_none()
        inserted = False
        if row is None:  # a concurrent request may still store the same sweep first
            row, inserted = insert_or_get(
                session, SweepRecord(stats_id=stats_id, cache_key=key, request=request, plan_ids=plan_ids), find
            )
        session.commit()
        return row, stats, inserted


@router.post("", response_model=SweepOut, status_code=status.HTTP_201_CREATED,
             responses={**SWEEP_FROM_CACHE, **SOLVE_ERRORS})
async def create_sweep(
    body: SweepRequest, project: ProjectDep, settings: SettingsDep, factory: SessionFactoryDep, solver: SolverDep,
    response: Response,
) -> SweepOut:
    """Plans at each budget (missing ones solved in one job), stored as a new sweep (201) or the same as
    before (200); the curve is also a chart."""
    started = time.monotonic()  # one time_limit_s for the whole sweep, from here
    check_time_limit(body.time_limit_s, settings.max_time_limit_s)
    budgets = body.budgets()
    stats_id = await stats_id_of(factory, project, body, UploadLimits.of(settings))
    plans = await plans_for(factory, solver, project, stats_id, budgets, body, started=started)
    points = [sweep_point(p) for p in plans]
    if any(p.id is None for p in plans):  # a solver error: answer, but store no sweep of it
        response.status_code = status.HTTP_200_OK
        stats = await run_in_threadpool(lambda: _stats_row(factory, project, stats_id))
        return SweepOut(id=None, stats_id=stats_id, cached=False, created_at=stats.created_at,
                        baseline_peak_bytes=stats.baseline_peak_bytes, compute_ms=stats.compute_ms,
                        points=points, chart_url=None)
    request = {**body.cache_fields(), "budgets_gib": budgets}
    row, stats, inserted = await run_in_threadpool(_record, factory, project, stats_id, request, plans)
    if not inserted:
        response.status_code = status.HTTP_200_OK
    return sweep_out(row, stats, points, cached=all(p.cached for p in plans))


def _stats_row(factory: sessionmaker[Session], project: str, stats_id: str) -> StatsRecord:
    with factory() as session:
        return get_stats(session, project, stats_id)


def _load(session: Session, project: str, sweep_id: str) -> tuple[SweepRecord, StatsRecord, list[CachedPlan]]:
    row = session.execute(
        select(SweepRecord).join(StatsRecord).where(SweepRecord.id == sweep_id, StatsRecord.project == project)
    ).scalar_one_or_none() if is_id(sweep_id) else None
    if row is None:
        raise NotFound(f"sweep id {sweep_id} does not exist")
    stats = get_stats(session, project, row.stats_id)
    found = {r.id: r for r in session.execute(select(PlanRecord).where(PlanRecord.id.in_(row.plan_ids))).scalars()}
    return row, stats, [CachedPlan.of(found[i], cached=True) for i in row.plan_ids]


@router.get("/{sweep_id}", response_model=SweepOut, responses=NOT_FOUND)
def read_sweep(sweep_id: IdPath, project: ProjectDep, session: SessionDep) -> SweepOut:
    """A stored sweep."""
    row, stats, plans = _load(session, project, sweep_id)
    return sweep_out(row, stats, [sweep_point(p) for p in plans], cached=True)


@router.get("/{sweep_id}/chart.png", response_class=Response, responses={**PNG, **NOT_FOUND, **RENDER_BUSY})
async def sweep_chart(sweep_id: IdPath, project: ProjectDep, factory: SessionFactoryDep,
                      renderer: RendererDep) -> Response:
    """Recompute time against memory budget for the sweep's points."""
    row, stats, plans = await run_in_threadpool(_load_with, factory, project, sweep_id)
    key = ("sweep", row.id, iso_utc(row.created_at))
    png = await renderer.chart(key, sweep_chart_job, stats.model_name, [p.result for p in plans],
                               stats.baseline_peak_bytes)
    return Response(png, media_type="image/png")


def _load_with(factory: sessionmaker[Session], project: str,
               sweep_id: str) -> tuple[SweepRecord, StatsRecord, list[CachedPlan]]:
    with factory() as session:
        return _load(session, project, sweep_id)

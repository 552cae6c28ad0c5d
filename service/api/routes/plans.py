"""Plans: solve-or-serve-cached, read, chart."""

from __future__ import annotations

from fastapi import APIRouter, Response

from service.api.deps import IdPath, ProjectDep, SessionDep, SessionFactoryDep, SettingsDep, SolverDep
from service.cache import CachedPlan, get_plan, get_stats, parse_stored_stats, plan_json, plans_for
from service.charts import plan_chart_png
from service.errors import InvalidInput
from service.schemas import ErrorOut, PlanOut, PlanRequest

router = APIRouter(prefix="/v1/plans", tags=["plans"])

PNG = {200: {"content": {"image/png": {}}, "description": "A PNG chart"}}
_404 = {404: {"model": ErrorOut, "description": "No such id in your project"}}
STALE_STATS = {409: {"model": ErrorOut, "description": "The stats were stored by an older planner and fail this "
                                                      "one's validation: upload them corrected, or delete them"}}


def check_time_limit(time_limit_s: float, max_time_limit_s: float) -> None:
    """The service's own bound (a setting, also the OpenAPI document's maximum; see ``service.main``)."""
    if time_limit_s > max_time_limit_s:
        message = f"time_limit_s {time_limit_s} is above this service's maximum {max_time_limit_s}"
        raise InvalidInput(message, errors=[{"loc": ["body", "time_limit_s"], "msg": message, "input": time_limit_s}])


def plan_response(plan: CachedPlan) -> Response:
    # Stored plans are served as stored: no re-validation on the hot path.
    return Response(plan_json(plan), media_type="application/json",
                    headers={"X-Cache": "hit" if plan.cached else "miss"})


@router.post(
    "",
    response_model=PlanOut,
    responses={**_404, **STALE_STATS, 422: {"model": ErrorOut, "description": "Invalid request field (named)"},
               503: {"model": ErrorOut, "description": "Solver queue full: retry after Retry-After seconds"}},
)
async def create_plan(
    body: PlanRequest, project: ProjectDep, settings: SettingsDep, factory: SessionFactoryDep, solver: SolverDep
) -> Response:
    """Plan one budget: from the cache (``cached: true``, no solve) or solved now and stored."""
    check_time_limit(body.time_limit_s, settings.max_time_limit_s)
    [plan] = await plans_for(factory, solver, project, body.stats_id, [body.memory_budget_gib], body)
    return plan_response(plan)


@router.get("/{plan_id}", response_model=PlanOut, responses=_404)
async def read_plan(plan_id: IdPath, project: ProjectDep, factory: SessionFactoryDep) -> Response:
    """A stored plan."""
    # One primary-key read, on the event loop: a thread hop costs more than the
    # query (and SQLite WAL readers never wait for writers).
    with factory() as session:
        return plan_response(CachedPlan.of(get_plan(session, project, plan_id), cached=True))


@router.get("/{plan_id}/chart.png", response_class=Response, responses={**PNG, **_404, **STALE_STATS})
def plan_chart(plan_id: IdPath, project: ProjectDep, session: SessionDep) -> Response:
    """Memory per module across the step, without and with the plan, and the budget line."""
    plan = CachedPlan.of(get_plan(session, project, plan_id), cached=True)
    stats = parse_stored_stats(plan.stats_id, get_stats(session, project, plan.stats_id).document)
    return Response(plan_chart_png(stats, plan.plan()), media_type="image/png")


__all__ = ["router", "check_time_limit"]

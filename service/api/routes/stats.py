"""Stats uploads: create (idempotent by content hash), list, read, delete."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request, Response, status
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from service.api.deps import IdPath, ProjectDep, RendererDep, SessionDep, SessionFactoryDep, SettingsDep
from service.api.responses import (
    ALREADY_UPLOADED, INVALID_STATS, RENDER_BUSY, STALE_STATS, STATS_NOT_FOUND, TOO_LARGE,
)
from service.errors import InvalidInput
from service.examples import EXAMPLE_STATS
from service.schemas import PlanPage, StatsDetail, StatsPage, StatsSummary
from service.store import (
    PlanRecord, StatsRecord, StatsTag, SweepRecord, get_stats, store_stats, store_stats_body,
)
from service.text import check_storable
from service.transport import DeferredBodyRoute, UploadLimits, deferred_body
from service.views import plan_summary, raise_if_stale, stats_detail_job, stats_summary

router = APIRouter(prefix="/v1/stats", tags=["stats"], route_class=DeferredBodyRoute)

StatsBody = Annotated[
    dict[str, Any],
    Body(
        description="A stats document: sacplan.stats/v1, or PyTorch's format (module_info + sac_stats).",
        openapi_examples={
            "two_layers_v1": {"summary": "Stats v1, two layers", "value": EXAMPLE_STATS},
        },
    ),
]


@router.post(
    "",
    response_model=StatsSummary,
    status_code=status.HTTP_201_CREATED,
    responses={**ALREADY_UPLOADED, **INVALID_STATS, **TOO_LARGE},
)
async def upload_stats(doc: StatsBody, project: ProjectDep, factory: SessionFactoryDep, settings: SettingsDep,
                       renderer: RendererDep, request: Request, response: Response) -> StatsSummary:
    """Upload stats; the same document again returns the existing id (200) instead of a new one (201).

    Documents past this service's limits on modules, ops or nesting depth are refused (413) before validation.
    """
    limits = UploadLimits.of(settings)
    body = deferred_body(request)  # over a MiB: parsed and validated in a render process
    if body is not None:
        row, inserted = await store_stats_body(factory, renderer.run, project, body, limits=limits)
    else:
        row, inserted = await store_stats(factory, project, doc, limits=limits)
    if not inserted:  # the same document uploaded before: its existing id
        response.status_code = status.HTTP_200_OK
    return stats_summary(row)


@router.get("", response_model=StatsPage)
def list_stats(
    project: ProjectDep,
    session: SessionDep,
    # The patterns are the document's account of what is refused below (no NUL: no database stores it;
    # a tag starts with its key); the checks themselves are ours, to name the field and the character.
    model_name: Annotated[str | None, Query(max_length=256, description="Exact model name.",
                                            json_schema_extra={"pattern": "^[^\\x00]*$"})] = None,
    tag: Annotated[str | None, Query(max_length=1200, description="'key' (uploads having that tag) or 'key=value'.",
                                     json_schema_extra={"pattern": "^[^=\\x00][^\\x00]*$"})] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**62)] = 0,
) -> StatsPage:
    """List your stats uploads, newest first; filter by model name or tag."""
    query = select(StatsRecord).where(StatsRecord.project == project)
    for name, value in (("model_name", model_name), ("tag", tag)):
        if value is not None:
            check_storable(value, ["query", name])
    if model_name is not None:
        query = query.where(StatsRecord.model_name == model_name)
    if tag is not None:
        key, has_value, value = tag.partition("=")
        if not key:
            message = f"tag {tag!r} names no key: give 'key' (uploads having that tag) or 'key=value'"
            raise InvalidInput(message, errors=[{"loc": ["query", "tag"], "msg": message, "input": tag}])
        cond = StatsTag.key == key
        if has_value:
            cond = cond & (StatsTag.value == value)
        query = query.where(StatsRecord.id.in_(select(StatsTag.stats_id).where(cond)))
    total = session.execute(select(func.count()).select_from(query.subquery())).scalar_one()
    newest_first = (StatsRecord.created_at.desc(), StatsRecord.id.desc())  # ids are random: time orders
    rows = session.execute(query.order_by(*newest_first).limit(limit).offset(offset)).scalars()
    return StatsPage(items=[stats_summary(r) for r in rows], total=total, limit=limit, offset=offset)


@router.get("/{stats_id}", response_model=StatsDetail, responses={**STATS_NOT_FOUND, **STALE_STATS, **RENDER_BUSY})
async def read_stats(stats_id: IdPath, project: ProjectDep, factory: SessionFactoryDep,
                     renderer: RendererDep) -> Response:
    """One upload: its summary and module tree."""
    summary, document = await run_in_threadpool(_summary_and_document, factory, project, stats_id)
    # validating a large document again is seconds of CPU: in a render process, never on the event loop
    body = raise_if_stale(await renderer.run(stats_detail_job, stats_id, document, summary))
    return Response(body, media_type="application/json")


def _summary_and_document(factory: sessionmaker[Session], project: str, stats_id: str) -> tuple[str, str]:
    with factory() as session:
        row = get_stats(session, project, stats_id)
        return stats_summary(row).model_dump_json(), row.document


@router.delete("/{stats_id}", status_code=status.HTTP_204_NO_CONTENT, responses=STATS_NOT_FOUND)
def delete_stats(stats_id: IdPath, project: ProjectDep, session: SessionDep) -> Response:
    """Delete an upload with its plans and sweeps."""
    row = get_stats(session, project, stats_id)
    # Explicit deletes: correct even on a database that ignores ON DELETE CASCADE.
    session.execute(delete(SweepRecord).where(SweepRecord.stats_id == row.id))
    session.execute(delete(PlanRecord).where(PlanRecord.stats_id == row.id))
    session.delete(row)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{stats_id}/plans", response_model=PlanPage, responses=STATS_NOT_FOUND)
def list_stats_plans(
    stats_id: IdPath,
    project: ProjectDep,
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0, le=2**62)] = 0,
) -> PlanPage:
    """The plans cached for one upload, by budget."""
    get_stats(session, project, stats_id)
    query = select(PlanRecord).where(PlanRecord.stats_id == stats_id)
    total = session.execute(select(func.count()).select_from(query.subquery())).scalar_one()
    rows = session.execute(
        query.order_by(PlanRecord.memory_budget_gib, PlanRecord.created_at, PlanRecord.id).limit(limit).offset(offset)
    ).scalars()
    return PlanPage(items=[plan_summary(r) for r in rows], total=total, limit=limit, offset=offset)

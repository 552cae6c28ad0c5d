"""Stats uploads: create (idempotent by content hash), list, read, delete."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Response, status
from sqlalchemy import delete, func, select

import planner
from planner import GIB, Stats, baseline_peak_bytes, compute_ms
from service.api.deps import IdPath, ProjectDep, SessionDep
from service.api.responses import ALREADY_UPLOADED, INVALID_STATS, STALE_STATS, STATS_NOT_FOUND
from service.cache import get_stats, parse_stored_stats
from service.db import insert_or_get
from service.errors import InvalidInput
from service.examples import EXAMPLE_STATS
from service.models import PlanRecord, StatsRecord, StatsTag, SweepRecord
from service.schemas import ModuleNode, PlanPage, PlanSummary, StatsDetail, StatsPage, StatsSummary

router = APIRouter(prefix="/v1/stats", tags=["stats"])

StatsBody = Annotated[
    dict[str, Any],
    Body(
        description="A stats document: sacplan.stats/v1, or PyTorch's format (module_info + sac_stats).",
        openapi_examples={
            "two_layers_v1": {"summary": "Stats v1, two layers", "value": EXAMPLE_STATS},
        },
    ),
]


def _summary(row: StatsRecord) -> StatsSummary:
    return StatsSummary(
        id=row.id, model_name=row.model_name, content_hash=row.content_hash, source_format=row.source_format,
        module_count=row.module_count, op_count=row.op_count, baseline_peak_bytes=row.baseline_peak_bytes,
        baseline_peak_gib=row.baseline_peak_bytes / GIB, compute_ms=row.compute_ms,
        tags={t.key: t.value for t in row.tags}, created_at=row.created_at,
    )


def _tree(stats: Stats) -> ModuleNode:
    nodes = {
        m.fqn: ModuleNode(fqn=m.fqn, is_leaf=m.is_leaf, op_count=None if m.ops is None else len(m.ops),
                          act_saved_bytes=m.act_saved_bytes, fw_ms=m.fw_ms, bw_ms=m.bw_ms)
        for m in stats.modules
    }
    for fqn in stats.fw_pre_order:  # pre-order keeps children in execution order
        parent = stats.module(fqn).parent
        if parent is not None:
            nodes[parent].children.append(nodes[fqn])
    return nodes[stats.root.fqn]


def _new_record(project: str, doc: dict[str, Any]) -> StatsRecord:
    try:
        stats = planner.parse_stats(doc)
    except planner.StatsError as exc:
        raise InvalidInput(f"invalid stats: {exc}", errors=exc.errors) from None
    source = "v1" if doc.get("format") else "torch"
    row = StatsRecord(
        project=project, content_hash=planner.stats_hash(stats), model_name=stats.metadata.model_name,
        source_format=source, module_count=len(stats.modules),
        op_count=sum(len(m.ops or ()) for m in stats.modules),
        baseline_peak_bytes=baseline_peak_bytes(stats), compute_ms=compute_ms(stats),
        document=stats.canonical_json(),
    )
    row.tags = [StatsTag(key=k, value=v) for k, v in stats.metadata.tags.items()]
    return row


@router.post(
    "",
    response_model=StatsSummary,
    status_code=status.HTTP_201_CREATED,
    responses={**ALREADY_UPLOADED, **INVALID_STATS},
)
def upload_stats(doc: StatsBody, project: ProjectDep, session: SessionDep, response: Response) -> StatsSummary:
    """Upload stats; the same document again returns the existing id (200) instead of a new one (201)."""
    row = _new_record(project, doc)
    same_document = select(StatsRecord).where(StatsRecord.project == project,
                                              StatsRecord.content_hash == row.content_hash)
    stored = session.execute(same_document).scalar_one_or_none()
    inserted = False
    if stored is None:  # a concurrent upload of the same document may still win the race to insert
        stored, inserted = insert_or_get(session, row, same_document)
    if not inserted:  # the same document uploaded before: its existing id
        response.status_code = status.HTTP_200_OK
    return _summary(stored)


@router.get("", response_model=StatsPage)
def list_stats(
    project: ProjectDep,
    session: SessionDep,
    model_name: Annotated[str | None, Query(max_length=256, description="Exact model name.")] = None,
    tag: Annotated[str | None, Query(max_length=1200,
                                     description="'key' (uploads having that tag) or 'key=value'.")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**62)] = 0,
) -> StatsPage:
    """List your stats uploads, newest first; filter by model name or tag."""
    query = select(StatsRecord).where(StatsRecord.project == project)
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
    rows = session.execute(query.order_by(StatsRecord.id.desc()).limit(limit).offset(offset)).scalars()
    return StatsPage(items=[_summary(r) for r in rows], total=total, limit=limit, offset=offset)


@router.get("/{stats_id}", response_model=StatsDetail, responses={**STATS_NOT_FOUND, **STALE_STATS})
def read_stats(stats_id: IdPath, project: ProjectDep, session: SessionDep) -> StatsDetail:
    """One upload: its summary and module tree."""
    row = get_stats(session, project, stats_id)
    stats = parse_stored_stats(row.id, row.document)
    return StatsDetail(**_summary(row).model_dump(), module_tree=_tree(stats))


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
        query.order_by(PlanRecord.memory_budget_gib, PlanRecord.id).limit(limit).offset(offset)
    ).scalars()
    items = [
        PlanSummary(id=r.id, stats_id=r.stats_id, memory_budget_gib=r.memory_budget_gib, world_size=r.world_size,
                    status=r.status, peak_bytes=r.peak_bytes, recompute_ms=r.recompute_ms,
                    solve_seconds=r.solve_seconds, planner_version=r.planner_version,
                    created_at=r.created_at)
        for r in rows
    ]
    return PlanPage(items=items, total=total, limit=limit, offset=offset)

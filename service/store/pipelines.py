"""Pipeline plans as stored: one row per project and set of stage plans, naming them in stage order."""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.errors import NotFound
from service.store.db import insert_or_get, write_gate
from service.store.ids import is_id, shown_id
from service.store.models import PipelinePlanRecord, PlanRecord, StatsRecord
from service.store.plans import CachedPlan

__all__ = ["keep_pipeline_plan", "get_pipeline_plan"]


def keep_pipeline_plan(factory: sessionmaker[Session], project: str, stats_ids: list[str], request: dict[str, Any],
                       plans: list[CachedPlan]) -> tuple[PipelinePlanRecord, bool]:
    """The pipeline plan of these stage plans (in stage order), stored now unless it already was; and whether this
    call stored it."""
    plan_ids = [p.id for p in plans]
    key = hashlib.sha256(",".join(str(i) for i in plan_ids).encode()).hexdigest()
    with write_gate(factory), factory() as session:
        find = select(PipelinePlanRecord).where(PipelinePlanRecord.project == project,
                                                PipelinePlanRecord.cache_key == key)
        row = session.execute(find).scalar_one_or_none()
        inserted = False
        if row is None:  # a concurrent request may still store the same one first
            row, inserted = insert_or_get(session, PipelinePlanRecord(
                project=project, cache_key=key, request=request, stats_ids=stats_ids, plan_ids=plan_ids), find)
        session.commit()
        return row, inserted


def get_pipeline_plan(session: Session, project: str,
                      pipeline_plan_id: str) -> tuple[PipelinePlanRecord, list[CachedPlan], list[StatsRecord]]:
    """The project's pipeline plan ``pipeline_plan_id``, its stage plans (cached) and its stages' uploads, both in
    stage order. One whose stage upload was deleted since is gone: 404."""
    row = session.execute(
        select(PipelinePlanRecord).where(PipelinePlanRecord.id == pipeline_plan_id,
                                         PipelinePlanRecord.project == project)
    ).scalar_one_or_none() if is_id(pipeline_plan_id) else None
    if row is None:
        raise NotFound(f"pipeline plan id {shown_id(pipeline_plan_id)} does not exist")
    found = {r.id: r for r in session.execute(select(PlanRecord).where(PlanRecord.id.in_(row.plan_ids))).scalars()}
    stats = {r.id: r for r in session.execute(select(StatsRecord).where(StatsRecord.id.in_(row.stats_ids),
                                                                        StatsRecord.project == project)).scalars()}
    if any(i not in found for i in row.plan_ids) or any(i not in stats for i in row.stats_ids):
        raise NotFound(f"pipeline plan id {shown_id(pipeline_plan_id)} does not exist (a stage's upload was deleted)")
    return row, [CachedPlan.of(found[i], cached=True) for i in row.plan_ids], [stats[i] for i in row.stats_ids]

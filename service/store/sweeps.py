"""Sweeps as stored: one row per upload and set of plans, naming its points' plans in budget order."""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.errors import NotFound
from service.store.db import insert_or_get, write_gate
from service.store.ids import is_id, shown_id
from service.store.models import PlanRecord, StatsRecord, SweepRecord
from service.store.plans import CachedPlan
from service.store.stats import get_stats

__all__ = ["keep_sweep", "get_sweep"]


def keep_sweep(factory: sessionmaker[Session], project: str, stats_id: str, request: dict[str, Any],
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


def get_sweep(session: Session, project: str, sweep_id: str) -> tuple[SweepRecord, StatsRecord, list[CachedPlan]]:
    """The project's sweep ``sweep_id``, its stats and its plans (cached, in budget order)."""
    row = session.execute(
        select(SweepRecord).join(StatsRecord).where(SweepRecord.id == sweep_id, StatsRecord.project == project)
    ).scalar_one_or_none() if is_id(sweep_id) else None
    if row is None:
        raise NotFound(f"sweep id {shown_id(sweep_id)} does not exist")
    stats = get_stats(session, project, row.stats_id)
    found = {r.id: r for r in session.execute(select(PlanRecord).where(PlanRecord.id.in_(row.plan_ids))).scalars()}
    return row, stats, [CachedPlan.of(found[i], cached=True) for i in row.plan_ids]

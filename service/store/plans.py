"""The plan cache's rows: keys, lookups, stored plans as served, and storing solved ones.

A plan is stored under ``(stats_id, cache_key)``; the key covers the stats
content hash, every request field that changes the result and the planner
version, so a planner upgrade never serves a stale plan. Plans with status
``error`` are returned but never stored. Deciding what to solve is
``service.solving``'s.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import NoResultFound
from sqlalchemy.orm import Session, sessionmaker

from planner import PLANNER_VERSION
from service.errors import NotFound
from service.store.db import insert_or_get, write_gate
from service.store.ids import is_id, shown_id
from service.store.models import PlanRecord, StatsRecord
from service.store.ranges import check_in_range
from service.times import as_utc, iso_utc

__all__ = ["CachedPlan", "plan_json", "plan_cache_key", "get_plan", "find_plans", "store_plans"]


@dataclass(frozen=True)
class CachedPlan:
    """A plan as served: its stored JSON plus the envelope fields."""

    id: str | None
    stats_id: str
    created_at: datetime | None
    request: dict[str, Any]
    result: str  # the Plan, as JSON text
    cached: bool

    @classmethod
    def of(cls, row: PlanRecord, cached: bool) -> CachedPlan:
        return cls(row.id, row.stats_id, as_utc(row.created_at), row.request, row.result, cached)

    def plan(self) -> dict[str, Any]:
        return json.loads(self.result)


def plan_json(p: CachedPlan) -> bytes:
    """The PlanOut JSON of ``p`` without re-parsing the stored plan (cached reads stay cheap)."""
    envelope = {
        "id": p.id,
        "stats_id": p.stats_id,
        "cached": p.cached,
        "created_at": iso_utc(p.created_at),
        "request": p.request,
    }
    head = json.dumps(envelope, separators=(",", ":"))
    return (head[:-1] + "," + p.result[1:]).encode()


def plan_cache_key(content_hash: str, memory_budget_gib: float, fields: dict[str, Any]) -> str:
    """SHA-256 over everything that changes a plan."""
    doc = {"stats": content_hash, "memory_budget_gib": float(memory_budget_gib), "planner": PLANNER_VERSION, **fields}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def get_plan(session: Session, project: str, plan_id: str) -> PlanRecord:
    """The project's plan ``plan_id``; another project's id, or no id at all, is as absent as a missing one."""
    row = session.execute(
        select(PlanRecord).join(StatsRecord).where(PlanRecord.id == plan_id, StatsRecord.project == project)
    ).scalar_one_or_none() if is_id(plan_id) else None
    if row is None:
        raise NotFound(f"plan id {shown_id(plan_id)} does not exist")
    return row


def find_plans(session: Session, project: str, stats_id: str, fields: dict[str, Any],
               budgets_gib: list[float]) -> tuple[list[str], dict[str, CachedPlan]]:
    """Cache keys for the budgets, and the plans already stored under them (two indexed reads)."""
    content_hash = session.execute(
        select(StatsRecord.content_hash).where(StatsRecord.id == stats_id, StatsRecord.project == project)
    ).scalar_one_or_none() if is_id(stats_id) else None
    if content_hash is None:
        raise NotFound(f"stats_id {shown_id(stats_id)} does not exist")
    keys = [plan_cache_key(content_hash, b, fields) for b in budgets_gib]
    rows = session.execute(
        select(PlanRecord).where(PlanRecord.stats_id == stats_id, PlanRecord.cache_key.in_(keys))
    ).scalars()
    return keys, {r.cache_key: CachedPlan.of(r, cached=True) for r in rows}


def store_plans(factory: sessionmaker[Session], stats_id: str,
                entries: list[tuple[str, dict, dict, bool]]) -> dict[str, CachedPlan]:
    """Store solved plans; a plan another process stored first under the same key wins.

    Plans with status ``error`` and those of a stopped solve (``keep`` false) are answered, never stored.
    """
    out: dict[str, CachedPlan] = {}
    with write_gate(factory), factory() as session:
        for key, request, plan, keep in entries:
            if plan["status"] == "error" or not keep:
                out[key] = CachedPlan(None, stats_id, None, request, json.dumps(plan), cached=False)
                continue
            # A feasible plan's peak is within its budget (at most 1e9 GiB) and an infeasible one has none:
            # this holds by construction, checked so that a change to either is a 422, not a 500.
            for name in ("peak_bytes", "recompute_ms", "memory_budget_gib", "world_size", "solve_seconds"):
                check_in_range(PlanRecord, name, plan.get(name), what="of the plan", loc=["body"])
            row = PlanRecord(
                stats_id=stats_id, cache_key=key, planner_version=plan["planner_version"], request=request,
                memory_budget_gib=plan["memory_budget_gib"], world_size=plan["world_size"], status=plan["status"],
                peak_bytes=plan.get("peak_bytes"), recompute_ms=plan.get("recompute_ms"),
                solve_seconds=plan.get("solve_seconds", 0.0), result=json.dumps(plan, separators=(",", ":")),
            )
            same_key = select(PlanRecord).where(PlanRecord.stats_id == stats_id, PlanRecord.cache_key == key)
            try:
                stored, inserted = insert_or_get(session, row, same_key)
            except NoResultFound:  # the stats were deleted while we solved
                raise NotFound(f"stats_id {shown_id(stats_id)} does not exist") from None
            out[key] = CachedPlan.of(stored, cached=not inserted)
        session.commit()
    return out

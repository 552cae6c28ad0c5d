"""The plan cache: keys, lookups, storing solved plans, and solving what is missing.

A plan is stored under ``(stats_id, cache_key)``; the key covers the stats
content hash, every request field that changes the result and the planner
version, so a planner upgrade never serves a stale plan. Plans with status
``error`` are returned but never stored.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import NoResultFound
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

import planner
from planner import PLANNER_VERSION, Plan, Stats
from service import metrics
from service.db import insert_or_get, write_gate
from service.errors import InvalidInput, NotFound, SolverFailed, StoredStatsInvalid
from service.ids import is_id
from service.models import PlanRecord, StatsRecord
from service.schemas import PlanOptions
from service.solver import SolverPool, SolverStopped, solve_job
from service.solving import solve_once
from service.times import as_utc, iso_utc

__all__ = ["CachedPlan", "plan_cache_key", "get_stats", "get_plan", "parse_stored_stats", "plans_for", "plan_json",
           "stopped_plans"]


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


def get_stats(session: Session, project: str, stats_id: str) -> StatsRecord:
    """The project's stats upload ``stats_id``; another project's id, or no id at all, is as absent as a missing one."""
    row = session.get(StatsRecord, stats_id) if is_id(stats_id) else None
    if row is None or row.project != project:
        raise NotFound(f"stats_id {stats_id} does not exist")
    return row


def parse_stored_stats(stats_id: str, document: str) -> Stats:
    """A stored canonical document as Stats; StoredStatsInvalid (409) when this planner's validation rejects it.

    Documents are validated when uploaded, but by the planner of that day: a stricter
    planner may reject what an older one stored.
    """
    try:
        return planner.parse_stats(json.loads(document))
    except planner.StatsError as exc:
        raise StoredStatsInvalid(stats_id, str(exc), errors=exc.errors) from None


def get_plan(session: Session, project: str, plan_id: str) -> PlanRecord:
    row = session.execute(
        select(PlanRecord).join(StatsRecord).where(PlanRecord.id == plan_id, StatsRecord.project == project)
    ).scalar_one_or_none() if is_id(plan_id) else None
    if row is None:
        raise NotFound(f"plan id {plan_id} does not exist")
    return row


def _lookup(session: Session, project: str, stats_id: str, fields: dict[str, Any],
            budgets_gib: list[float]) -> tuple[list[str], dict[str, CachedPlan]]:
    """Cache keys for the budgets, and the plans already stored under them (two indexed reads)."""
    content_hash = session.execute(
        select(StatsRecord.content_hash).where(StatsRecord.id == stats_id, StatsRecord.project == project)
    ).scalar_one_or_none() if is_id(stats_id) else None
    if content_hash is None:
        raise NotFound(f"stats_id {stats_id} does not exist")
    keys = [plan_cache_key(content_hash, b, fields) for b in budgets_gib]
    rows = session.execute(
        select(PlanRecord).where(PlanRecord.stats_id == stats_id, PlanRecord.cache_key.in_(keys))
    ).scalars()
    return keys, {r.cache_key: CachedPlan.of(r, cached=True) for r in rows}


def _document(factory: sessionmaker[Session], stats_id: str) -> tuple[str, dict[str, Any]]:
    """The stored document, and the upload's no-plan figures (world_size 1)."""
    with factory() as session:
        row = session.execute(
            select(StatsRecord.document, StatsRecord.baseline_peak_bytes, StatsRecord.compute_ms)
            .where(StatsRecord.id == stats_id)
        ).first()
    if row is None:
        raise NotFound(f"stats_id {stats_id} does not exist")
    return row.document, {"baseline_peak_bytes": row.baseline_peak_bytes, "compute_ms": row.compute_ms}


def _store(factory: sessionmaker[Session], stats_id: str,
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
                raise NotFound(f"stats_id {stats_id} does not exist") from None
            out[key] = CachedPlan.of(stored, cached=not inserted)
        session.commit()
    return out


class _PlannerRejected(Exception):
    """The planner refused a request field; raised out of a shared solve, answered per caller."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


# A planner message starts with the field it rejects: "ac_units[0] 'Net' is the root module ...".
_FIELD_AT = re.compile(r"(?P<field>[a-z_]+)(?:\[(?P<index>[0-9]+)\])?")


def _planner_rejection(message: str, options: PlanOptions) -> InvalidInput:
    """The planner's ValueError as a 422 shaped like a schema one: the field, index and value the client sent.

    The planner saw the unit lists sorted and without repeats (as cached), so an
    index it names is mapped back to the client's own list.
    """
    m = _FIELD_AT.match(message)
    field = m["field"] if m and m["field"] in type(options).model_fields else None
    if field is None:
        return InvalidInput(message, errors=[{"loc": ["body"], "msg": message, "input": None}])
    sent = getattr(options, field)
    loc: list[str] = ["body", field]
    if m["index"] is not None and isinstance(sent, list):
        seen = options.cache_fields().get(field) or []
        k = int(m["index"])
        if k < len(seen) and seen[k] in sent:
            sent_k = sent.index(seen[k])
            message = f"{field}[{sent_k}]{message[m.end():]}"
            loc.append(str(sent_k))
            sent = seen[k]
    return InvalidInput(message, errors=[{"loc": loc, "msg": message, "input": sent}])


def stopped_plans(stopped: SolverStopped, budgets_gib: list[float], row_figures: dict[str, Any],
                   world_size: int) -> tuple[list[dict[str, Any]], list[bool]]:
    """The answer of a job stopped at its deadline or memory cap: the budgets it finished (stored), the others
    ``time_limit`` (or ``error`` at the memory cap), never stored."""
    base = next((p["base"] for p in stopped.partials if "base" in p), None)
    if base is None:  # stopped while reading the stats: the upload's own figures (world_size 1)
        base = {**row_figures, "world_size": world_size, "planner_version": PLANNER_VERSION}
    done = {p["point"]: p["plan"] for p in stopped.partials if "point" in p}
    status = "time_limit" if stopped.reason == "time_limit" else "error"
    plans = [done.get(i) or Plan(**base, status=status, message=stopped.message, memory_budget_gib=b)
             .model_dump(mode="json") for i, b in enumerate(budgets_gib)]
    return plans, [i in done for i in range(len(budgets_gib))]


async def _run_job(factory: sessionmaker[Session], pool: SolverPool, project: str, stats_id: str,
                   budgets_gib: list[float], fields: dict[str, Any], deadline: float) -> dict[str, Any]:
    """The solver's answer for the budgets, as JSON-able data (shared with identical requests elsewhere)."""
    pool.admit(project)  # refuse before reading a large document
    document, row_figures = await run_in_threadpool(_document, factory, stats_id)
    solver_options = {**fields, "time_limit_s": max(deadline - time.monotonic(), 1e-3)}
    try:
        out = await pool.run(solve_job, document, budgets_gib, solver_options, project=project, deadline=deadline)
    except SolverStopped as stopped:
        metrics.SOLVES_FINISHED.labels(stopped.reason).inc()
        plans, store = stopped_plans(stopped, budgets_gib, row_figures, fields.get("world_size", 1))
        return {"plans": plans, "store": store}
    except SolverFailed as exc:
        metrics.SOLVES_FINISHED.labels("failed").inc()
        return {"failed": exc.message}
    status = next((k for k in ("invalid", "stored_stats_invalid") if k in out), "ok")
    metrics.SOLVES_FINISHED.labels(status).inc()
    return out


async def plans_for(
    factory: sessionmaker[Session], pool: SolverPool, project: str, stats_id: str,
    budgets_gib: list[float], options: PlanOptions, *, started: float | None = None,
) -> list[CachedPlan]:
    """One plan per budget: from the cache, else solved (once, however many ask, in any process) and stored.

    ``started`` (``time.monotonic()`` when the request arrived) starts the clock of ``options.time_limit_s``.
    """
    fields = options.cache_fields()
    deadline = (started if started is not None else time.monotonic()) + options.time_limit_s

    # Two indexed reads, on the event loop: a thread hop costs more than they do,
    # and cache hits are the hot path (SQLite WAL readers never wait for writers).
    with factory() as session:
        keys, found = _lookup(session, project, stats_id, fields, budgets_gib)
    if found:
        metrics.CACHE_HITS.labels("store").inc(len(found))
    missing = [(k, b) for k, b in zip(keys, budgets_gib) if k not in found]
    if missing:
        flight_key = hashlib.sha256(f"{stats_id}:{','.join(k for k, _ in missing)}".encode()).hexdigest()

        async def solve() -> tuple[dict[str, CachedPlan], bool]:
            budgets = [b for _, b in missing]
            out, elsewhere = await solve_once(
                factory, flight_key, project,
                lambda: _run_job(factory, pool, project, stats_id, budgets, fields, deadline),
                wait_s=options.time_limit_s + pool.grace_s + 60, share=(pool.per_project, pool.retry_after_s))
            return await _answer(factory, stats_id, missing, fields, out), elsewhere

        try:
            (solved, elsewhere), joined = await pool.single_flight(flight_key, solve)
        except _PlannerRejected as exc:
            # callers sharing a flight may list their units in other orders: map the message to this one's
            raise _planner_rejection(exc.message, options) from None
        for k, p in solved.items():
            found[k] = CachedPlan(p.id, p.stats_id, p.created_at, p.request, p.result,
                                  cached=p.cached or joined or elsewhere)
    return [found[k] for k in keys]


async def _answer(factory: sessionmaker[Session], stats_id: str, missing: list[tuple[str, float]],
                  fields: dict[str, Any], out: dict[str, Any]) -> dict[str, CachedPlan]:
    """The solver's answer ``out`` as plans, stored (each caller does this: the first stores, the rest find)."""
    if "failed" in out:
        raise SolverFailed(out["failed"])
    if "stored_stats_invalid" in out:
        raise StoredStatsInvalid(stats_id, out["stored_stats_invalid"], errors=out["errors"])
    if "invalid" in out:
        raise _PlannerRejected(out["invalid"])  # told in each caller's own terms
    store = out.get("store") or [True] * len(missing)
    entries = [(k, {**fields, "memory_budget_gib": b}, plan, keep)
               for (k, b), plan, keep in zip(missing, out["plans"], store)]
    return await run_in_threadpool(_store, factory, stats_id, entries)

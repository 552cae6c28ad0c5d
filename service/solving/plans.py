"""Cached, or solved once: the plans a plan or sweep request asks for, decided in one place.

A request goes down through here in one pass: its time limit checked, its
inline stats stored as an upload (``service.store``), each budget's plan
looked up in the plan cache, the missing ones solved in one job (once, however
many ask, in any process: :func:`~service.solving.claims.solve_once`, in the
solver pool) and stored. Plans with status ``error``, and the unfinished
budgets of a solve stopped at its deadline or memory cap, are answered but
never stored.
"""

from __future__ import annotations

import hashlib
import re
import time
from typing import Any

from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from planner import PLANNER_VERSION, Plan
from service import metrics
from service.config import Settings
from service.errors import InvalidInput, SolverFailed, StoredStatsInvalid
from service.schemas import PlanOptions, StatsSource
from service.solving.claims import solve_once
from service.solving.pool import SolverPool, SolverStopped
from service.solving.process import solve_job
from service.store import CachedPlan, find_plans, stats_document, stats_id_of, store_plans
from service.transport import UploadLimits, check_time_limit

__all__ = ["plans_for", "cached_or_solved", "stopped_plans"]


async def plans_for(factory: sessionmaker[Session], pool: SolverPool, settings: Settings, project: str,
                    request: StatsSource, budgets_gib: list[float], *, started: float) -> tuple[str, list[CachedPlan]]:
    """The stats id a plan or sweep request names, and its plans, one per budget: cached, or solved once.

    In order: ``request.time_limit_s`` against the service's maximum (422), the inline ``stats`` stored as an
    upload would be (or ``stats_id`` as given), then :func:`cached_or_solved`. ``started``
    (``time.monotonic()`` when the request arrived) starts the clock of the time limit: storing inline stats
    and reading them count against it.
    """
    check_time_limit(request.time_limit_s, settings.max_time_limit_s)
    stats_id = await stats_id_of(factory, project, request, UploadLimits.of(settings))
    return stats_id, await cached_or_solved(factory, pool, project, stats_id, budgets_gib, request, started=started)


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
    # spent before a solve could start (reading a slow or large request): the figures only, not the document
    spent = time.monotonic() >= deadline
    document, row_figures = await run_in_threadpool(stats_document, factory, stats_id, document=not spent)
    solver_options = {**fields, "time_limit_s": max(deadline - time.monotonic(), 1e-3)}
    try:
        if spent or time.monotonic() >= deadline:
            raise SolverStopped("time_limit", "time_limit_s passed before the solve could start: reading the "
                                              "request took it all", [])
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


async def cached_or_solved(
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
        keys, found = find_plans(session, project, stats_id, fields, budgets_gib)
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
            # cached: this request did not run the solve. The one that ran it is never "cached", even when a caller
            # sharing its result (another process) stored the row first: exactly one caller answers 201.
            found[k] = CachedPlan(p.id, p.stats_id, p.created_at, p.request, p.result, cached=joined or elsewhere)
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
    return await run_in_threadpool(store_plans, factory, stats_id, entries)

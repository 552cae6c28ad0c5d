"""A plan or sweep request as the route needs it: when it arrived, and its body, large ones read off the event loop.

A request carrying its stats inline is as large as an upload (tens of MB). FastAPI
parsed it on the event loop into the request model, a dict per field, before the
route ran: ``/healthz`` stalled for half a second and more, and the route's clock
for ``time_limit_s`` started only after all that. Bodies over a MiB now reach the
route unparsed (``transport.deferred_body_route``) and are parsed and validated in
a render process, as uploads are (``store.store_request_body``); the clock starts
when the request's headers arrived (``transport.arrived_at``). When the limit passes before the inline stats
are validated and stored, the answer goes out at the limit (status ``time_limit``, no ``stats_id``) and nothing
is stored (``store.StatsNotInTime``).
"""

from __future__ import annotations

import time
from typing import TypeVar

from fastapi import Request, Response
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from planner import PLANNER_VERSION
from service.schemas import PlanOut, PlanRequest, StatsSource, SweepOut, SweepPoint, SweepRequest
from service.store import store_request_body
from service.transport import UploadLimits, arrived_at, deferred_body
from service.views import Renderer

__all__ = ["arrival_and_body", "not_in_time_message", "plan_not_in_time", "sweep_not_in_time"]

Body = TypeVar("Body", bound=StatsSource)


async def arrival_and_body(request: Request, body: Body, factory: sessionmaker[Session], renderer: Renderer,
                           settings: Settings, project: str) -> tuple[float, Body]:
    """``time.monotonic()`` at the request's arrival, and its body: ``body`` as FastAPI read it, or, for a body
    over a MiB (then ``body`` is a placeholder), the request read in a render process, its stats stored."""
    started = arrived_at(request.scope) or time.monotonic()
    raw = deferred_body(request)
    if raw is None:
        return started, body
    return started, await store_request_body(factory, renderer.run, project, raw, type(body),
                                             limits=UploadLimits.of(settings),
                                             max_time_limit_s=settings.max_time_limit_s, started=started)


def not_in_time_message(request: StatsSource) -> str:
    """What a ``time_limit`` answer says when the inline stats were not validated and stored in time."""
    return (f"time_limit_s ({request.time_limit_s:g} s) passed before the inline stats were validated and stored "
            f"(reading, validating and hashing them takes about a second per 8 MB): nothing was stored or solved, "
            f"so stats_id, baseline_peak_bytes and compute_ms are null. Upload the stats with POST /v1/stats (no "
            f"time limit) and plan with their stats_id, or send them again with a larger time_limit_s.")


def plan_not_in_time(request: PlanRequest) -> Response:
    """The answer (200) to a plan request whose time limit passed before its inline stats were stored."""
    out = PlanOut(id=None, stats_id=None, cached=False, created_at=None,
                  request={**request.cache_fields(), "memory_budget_gib": request.memory_budget_gib},
                  status="time_limit", message=not_in_time_message(request),
                  memory_budget_gib=request.memory_budget_gib, world_size=request.world_size,
                  baseline_peak_bytes=None, compute_ms=None, planner_version=PLANNER_VERSION)
    return Response(out.model_dump_json(), media_type="application/json")


def sweep_not_in_time(request: SweepRequest) -> SweepOut:
    """The answer (200) to a sweep request whose time limit passed before its inline stats were stored."""
    points = [SweepPoint(plan_id=None, memory_budget_gib=b, status="time_limit", peak_bytes=None, recompute_ms=None,
                         min_feasible_budget_gib=None, cached=False) for b in request.budgets()]
    return SweepOut(id=None, stats_id=None, cached=False, created_at=None, baseline_peak_bytes=None,
                    compute_ms=None, points=points, chart_url=None, message=not_in_time_message(request))

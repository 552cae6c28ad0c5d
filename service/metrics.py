"""Prometheus metrics (``prometheus_client``), correct across uvicorn worker processes.

With ``sacplan serve`` every worker process writes its samples to files under
``PROMETHEUS_MULTIPROC_DIR`` (set by the CLI before any worker starts) and
``GET /metrics`` adds them up, whichever worker answers. Without that
variable (an app built in-process, as the tests do) the samples are the
process's own.

``/metrics`` shows counts for the whole service (all projects together), so
its access is a setting: ``SACPLAN_METRICS`` ``off`` (404), ``public`` or
``key`` (``Authorization: Bearer <SACPLAN_METRICS_KEY>``).
"""

from __future__ import annotations

import os
import re
import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import multiprocess
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "REQUESTS", "REQUEST_SECONDS", "SOLVES_STARTED", "SOLVES_FINISHED", "TIME_LIMIT_STOPS", "QUEUE_DEPTH",
    "CACHE_HITS", "SOLVER_RECYCLED", "AUTH_FAILURES", "RequestMetrics", "queue_depth", "exposition",
    "mark_process_dead", "MULTIPROC_ENV",
]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

REQUESTS = Counter("sacplan_requests", "HTTP requests answered, by route template, method and status.",
                   ["route", "method", "status"])
REQUEST_SECONDS = Histogram(
    "sacplan_request_seconds", "Time from a request's arrival to the end of its answer, by route template.",
    ["route", "method"], buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
SOLVES_STARTED = Counter("sacplan_solves_started", "Solver jobs started (a sweep's missing budgets are one job).")
SOLVES_FINISHED = Counter(
    "sacplan_solves_finished", "Solver jobs finished, by outcome: ok, invalid (422), stored_stats_invalid (409), "
    "time_limit (stopped at its deadline), memory (stopped at the memory cap), failed (the process died or the "
    "job raised).", ["status"])
TIME_LIMIT_STOPS = Counter("sacplan_time_limit_stops", "Solves stopped (their process killed) at time_limit_s + grace.")
QUEUE_DEPTH = Gauge("sacplan_solver_queue_depth", "Solver jobs running or waiting.", multiprocess_mode="livesum")
CACHE_HITS = Counter("sacplan_cache_hits", "Plans answered from the plan cache, by where: store (the database) or "
                     "fastpath (the in-memory response cache).", ["where"])
SOLVER_RECYCLED = Counter("sacplan_solver_recycled", "Solver processes replaced, by reason: memory (passed the cap "
                          "while solving) or idle_memory (held too much after a job).", ["reason"])
AUTH_FAILURES = Counter("sacplan_auth_failures", "Requests refused for a missing or wrong API key (401), and "
                        "those refused for too many failures from their address (throttled).", ["kind"])

# Answers given before routing (the plan fast path) still get their route's template.
_TEMPLATES = ((re.compile(r"/v1/plans/[^/]+"), "/v1/plans/{plan_id}"),)


def queue_depth(change: int) -> None:
    QUEUE_DEPTH.inc(change)


def exposition() -> tuple[bytes, str]:
    """The metrics page: every worker process's samples together when multiprocess, else this process's."""
    if os.environ.get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    from prometheus_client import REGISTRY

    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


def mark_process_dead(pid: int) -> None:
    """Drop a stopped worker's live gauges (its counters stay counted)."""
    if os.environ.get(MULTIPROC_ENV):
        multiprocess.mark_process_dead(pid)


def _route(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    if path:
        return path
    for pattern, template in _TEMPLATES:
        if pattern.fullmatch(scope["path"]):
            return template
    return scope["path"] if scope["path"] == "/v1/plans" else "unmatched"


class RequestMetrics:
    """ASGI middleware counting each answer by route template and status, and timing it."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            route, method = _route(scope), scope["method"]
            REQUESTS.labels(route, method, str(status)).inc()
            REQUEST_SECONDS.labels(route, method).observe(time.perf_counter() - started)

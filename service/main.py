"""The FastAPI application, where the rooms meet: routers, error handling, docs, the body limit, the pools."""

from __future__ import annotations

import os
from contextlib import asynccontextmanager

from fastapi import FastAPI

from planner import PLANNER_VERSION

from service.api import (
    ROUTERS, AsciiJSONResponse, AuthThrottle, PlanFastPath, PlanResponseCache, install_error_handlers,
)
from service.config import Settings, get_settings
from service.docs import install_docs, install_openapi
from service.metrics import RequestMetrics, mark_process_dead
from service.solving import SolverPool
from service.store import make_engine, make_sessionmaker
from service.transport import BodySizeLimit, install_log_redaction
from service.views import Renderer

__all__ = ["create_app"]

DESCRIPTION = """
**sacplan** plans selective activation checkpointing: given what one training
step of your model costs, module by module and op by op, it tells you which
modules to checkpoint and exactly which ops to recompute so the step fits a GPU
memory budget with the least recomputation (exact: every reported figure is what the per-op save lists realize). Plans are cached:
the same stats and request come back instantly.

Three steps:

1. **Upload stats**: `POST /v1/stats` with a `sacplan.stats/v1` document (from
   `sacplan collect`) or PyTorch's `module_info` + `sac_stats` output. Note the `id`.
2. **Plan**: `POST /v1/plans` with `stats_id` and `memory_budget_gib` (or
   `POST /v1/sweeps` with several budgets for the recompute-vs-memory curve; or, for
   a pipeline, `POST /v1/pipeline-plans` naming every stage's upload in `stats_ids`).
   Or skip step 1: send the stats themselves as `stats` instead of `stats_id`;
   they are stored as an upload (the answer names their `stats_id`).
3. **Look**: `GET /v1/plans/{id}/chart.png` (the step's memory by kind,
   without and with the plan) or `GET /v1/sweeps/{id}/chart.png`; apply the plan's
   `modules[].save` lists with PyTorch's selective checkpointing.

When the service has API keys (`SACPLAN_API_KEYS`), press **Authorize** and
give your key: each key sees only its own project's stats and plans.
"""


def create_app(settings: Settings | None = None, *, solver: SolverPool | None = None) -> FastAPI:
    """Build the app; the database must already be at the migrations' head (``sacplan db upgrade``).

    A ``solver`` passed in is shared and left running; otherwise the app owns one.
    """
    settings = settings or get_settings()
    engine = make_engine(settings.sqlalchemy_url, sqlite_busy_timeout_ms=settings.sqlite_busy_timeout_ms)
    owns_solver = solver is None
    pool = solver or SolverPool(
        settings.solver_workers, settings.solver_queue_size, settings.retry_after_s,
        per_project=settings.solver_per_project, memory_cap_bytes=settings.solver_memory_mb * 2**20,
        idle_memory_bytes=settings.solver_idle_memory_mb * 2**20, grace_s=settings.solver_grace_s)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        if owns_solver:
            pool.start()
        if app.state.renderer.prestart:
            app.state.renderer.warm()  # the first large body or chart does not wait for a process to start
        yield
        if owns_solver:
            pool.shutdown()
        app.state.renderer.shutdown()
        mark_process_dead(os.getpid())
        engine.dispose()

    app = FastAPI(
        default_response_class=AsciiJSONResponse,
        title="sacplan",
        version=PLANNER_VERSION,  # the package's version (/healthz gives the service's too)
        summary="Selective activation checkpointing planner as a service.",
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # install_docs: the same pages, their assets served from here
        redoc_url=None,
        openapi_tags=[
            {"name": "stats", "description": "Step 1: upload what a training step costs."},
            {"name": "plans", "description": "Step 2: a checkpointing plan for one memory budget (cached)."},
            {"name": "sweeps", "description": "Plans across budgets: the recompute-vs-memory curve."},
            {"name": "pipeline-plans", "description": "Every stage of a pipeline under one budget (each stage's "
                                                      "upload named), and the pipeline's predicted step."},
            {"name": "health", "description": "Liveness and readiness."},
        ],
    )
    app.state.settings = settings
    install_log_redaction(settings)  # in every worker process: the access log writes request paths
    app.state.engine = engine
    app.state.session_factory = make_sessionmaker(engine)
    app.state.solver = pool
    app.state.auth_failures = AuthThrottle(app.state.session_factory, settings.auth_failures_per_window,
                                           settings.auth_failure_window_s, sync_s=settings.auth_failure_sync_s)
    app.state.renderer = Renderer(settings.render_workers, settings.render_queue_size, settings.retry_after_s,
                                  settings.chart_cache_entries, memory_cap_bytes=settings.render_memory_mb * 2**20,
                                  idle_memory_bytes=settings.render_idle_memory_mb * 2**20,
                                  nice=settings.render_nice, preload=("planner", "service.store"),
                                  prestart=settings.render_prestart)
    install_error_handlers(app)
    install_openapi(app, settings)
    install_docs(app)
    for router in ROUTERS:
        app.include_router(router)
    app.state.plan_responses = PlanResponseCache(settings.plan_response_cache_entries,
                                                 settings.plan_response_cache_mib * 2**20)
    # Starlette runs the last added middleware first: the body limit holds for the fast path too.
    app.add_middleware(PlanFastPath, settings=settings, engine=engine, cache=app.state.plan_responses,
                       throttle=app.state.auth_failures)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes, held_bytes=settings.body_memory_mb * 2**20,
                       retry_after_s=settings.retry_after_s)
    app.add_middleware(RequestMetrics)  # outermost: counts every answer, the fast path's and 413s too
    return app

"""The FastAPI application: routers, error handling, the body limit, the solver pool."""

from __future__ import annotations

import json
import logging
import math
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.api.routes import health, plans, stats, sweeps
from service.config import Settings, get_settings
from service.db import make_engine, make_sessionmaker
from service.docs import install_docs
from service.errors import ServiceError
from service.fastpath import PlanFastPath, PlanResponseCache
from service.limits import document_limits
from service.middleware import BodySizeLimit
from service.solver import SolverPool
from service.version import SERVICE_VERSION

__all__ = ["create_app"]

log = logging.getLogger("service")

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
   `POST /v1/sweeps` with several budgets for the recompute-vs-memory curve).
3. **Look**: `GET /v1/plans/{id}/chart.png` (memory per module with and
   without the plan) or `GET /v1/sweeps/{id}/chart.png`; apply the plan's
   `modules[].save` lists with PyTorch's selective checkpointing.

When the service has API keys (`SACPLAN_API_KEYS`), press **Authorize** and
give your key: each key sees only its own project's stats and plans.
"""


class AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: a lone surrogate a client sent ("\\ud800",
    valid JSON, not valid UTF-8) comes back escaped instead of failing the response."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def _error(status: int, detail: str, errors: list[dict[str, Any]] | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    content: dict[str, Any] = {"detail": _clean(detail)}
    if status == 422 and not errors:  # every 422 has the same keys, schema or planner or service
        errors = [{"loc": [], "msg": detail, "input": None}]
    if errors is not None:
        content["errors"] = [_error_item(e) for e in errors]
    return AsciiJSONResponse(content, status_code=status, headers=headers)


def _error_item(e: dict[str, Any]) -> dict[str, Any]:
    """One field's error, always as loc, msg and input."""
    return {"loc": [str(x) for x in e.get("loc", ())], "msg": _clean(e.get("msg", "")),
            "input": _short(e.get("input"))}


def _clean(msg: str) -> str:
    # pydantic prefixes the message of a ValueError raised by a validator; it says nothing to a client.
    return msg.removeprefix("Value error, ")


def _short(value: Any) -> Any:
    """The offending input, small and JSON-safe (bytes, NaN and big objects included)."""
    if isinstance(value, (dict, list)):
        return f"<{type(value).__name__} of {len(value)}>"
    if isinstance(value, bool) or value is None or (isinstance(value, float) and math.isfinite(value)):
        return value
    if isinstance(value, bytes):
        value = value[:80].decode("utf-8", "replace")
    if isinstance(value, int) and value.bit_length() > 64:
        return f"<int of {value.bit_length()} bits>"
    if isinstance(value, int):
        return value
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _validation_errors(exc: RequestValidationError) -> tuple[str, list[dict[str, Any]]]:
    errors = [_error_item(e) for e in exc.errors()]
    # The value as the client wrote it in JSON: true, "5" (not Python's True, '5').
    parts = [f"{'.'.join(x['loc'])}: {x['msg']} (got {json.dumps(x['input'])})" for x in errors[:5]]
    more = f"; and {len(errors) - 5} more" if len(errors) > 5 else ""
    return "; ".join(parts) + more, errors


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def service_error(_: Request, exc: ServiceError) -> JSONResponse:
        return _error(exc.status_code, exc.message, exc.errors, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        detail, errors = _validation_errors(exc)
        return _error(422, detail, errors)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # A bug, not bad input: log it (never the headers: they may hold keys).
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _error(500, f"internal error: {type(exc).__name__}")


def create_app(settings: Settings | None = None, *, solver: SolverPool | None = None) -> FastAPI:
    """Build the app; the database must already be at the migrations' head (``sacplan db upgrade``).

    A ``solver`` passed in is shared and left running; otherwise the app owns one.
    """
    settings = settings or get_settings()
    engine = make_engine(settings.sqlalchemy_url, sqlite_busy_timeout_ms=settings.sqlite_busy_timeout_ms)
    owns_solver = solver is None
    pool = solver or SolverPool(settings.solver_workers, settings.solver_queue_size, settings.retry_after_s)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        if owns_solver:
            pool.start()
        yield
        if owns_solver:
            pool.shutdown()
        engine.dispose()

    app = FastAPI(
        default_response_class=AsciiJSONResponse,
        title="sacplan",
        version=SERVICE_VERSION,
        summary="Selective activation checkpointing planner as a service.",
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # install_docs: the same pages, their assets served from here
        redoc_url=None,
        openapi_tags=[
            {"name": "stats", "description": "Step 1: upload what a training step costs."},
            {"name": "plans", "description": "Step 2: a checkpointing plan for one memory budget (cached)."},
            {"name": "sweeps", "description": "Plans across budgets: the recompute-vs-memory curve."},
            {"name": "health", "description": "Liveness and readiness."},
        ],
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.session_factory = make_sessionmaker(engine)
    app.state.solver = pool
    _install_error_handlers(app)
    document_limits(app, settings)
    install_docs(app)
    for module in (health, stats, plans, sweeps):
        app.include_router(module.router)
    app.state.plan_responses = PlanResponseCache(settings.plan_response_cache_entries,
                                                 settings.plan_response_cache_mib * 2**20)
    # Starlette runs the last added middleware first: the body limit holds for the fast path too.
    app.add_middleware(PlanFastPath, settings=settings, engine=engine, cache=app.state.plan_responses)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    return app

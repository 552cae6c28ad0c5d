"""Liveness and readiness."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request, Response
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool

from planner import PLANNER_VERSION
from service.api.deps import SessionDep, SettingsDep
from service.api.responses import DATABASE_UNREACHABLE
from service.errors import NotFound, ServiceError, Unauthorized
from service.metrics import exposition
from service.schemas import HealthOut, ReadyOut
from service.version import SERVICE_VERSION

router = APIRouter(tags=["health"])


class NotReady(ServiceError):
    status_code = 503


@router.get("/healthz", response_model=HealthOut)
async def healthz() -> HealthOut:
    """Liveness: answers while the process runs, even during long solves; says nothing about load or tenants."""
    return HealthOut(service_version=SERVICE_VERSION, planner_version=PLANNER_VERSION)


@router.get("/metrics", response_class=Response, include_in_schema=False)
async def metrics_page(request: Request, settings: SettingsDep) -> Response:
    """Prometheus metrics of the whole service (all worker processes), if SACPLAN_METRICS allows."""
    if settings.metrics == "off":
        raise NotFound("metrics are off on this service (SACPLAN_METRICS=off)")
    if settings.metrics == "key":
        scheme, _, offered = request.headers.get("authorization", "").partition(" ")
        expected = settings.metrics_key.get_secret_value().encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(offered.strip().encode(), expected):
            raise Unauthorized("/metrics needs 'Authorization: Bearer <SACPLAN_METRICS_KEY>'")
    body, content_type = await run_in_threadpool(exposition)
    return Response(body, media_type=content_type)


@router.get("/readyz", response_model=ReadyOut, responses=DATABASE_UNREACHABLE)
def readyz(session: SessionDep) -> ReadyOut:
    """Readiness: the database answers a query."""
    try:
        session.execute(text("SELECT 1"))
    except Exception as exc:  # any driver error means not ready
        raise NotReady(f"database unreachable: {type(exc).__name__}") from None
    return ReadyOut(database=session.get_bind().dialect.name)

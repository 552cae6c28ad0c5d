"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text

from planner import PLANNER_VERSION
from service.api.deps import SessionDep, SolverDep
from service.api.responses import DATABASE_UNREACHABLE
from service.errors import ServiceError
from service.schemas import HealthOut, ReadyOut, SolverStatsOut
from service.version import SERVICE_VERSION

router = APIRouter(tags=["health"])


class NotReady(ServiceError):
    status_code = 503


@router.get("/healthz", response_model=HealthOut)
async def healthz(solver: SolverDep) -> HealthOut:
    """Liveness: answers while the process runs, even during long solves."""
    return HealthOut(
        service_version=SERVICE_VERSION,
        planner_version=PLANNER_VERSION,
        solver=SolverStatsOut(workers=solver.workers, capacity=solver.capacity,
                              in_flight=solver.in_flight, solves_started=solver.solves_started),
    )


@router.get("/readyz", response_model=ReadyOut, responses=DATABASE_UNREACHABLE)
def readyz(session: SessionDep) -> ReadyOut:
    """Readiness: the database answers a query."""
    try:
        session.execute(text("SELECT 1"))
    except Exception as exc:  # any driver error means not ready
        raise NotReady(f"database unreachable: {type(exc).__name__}") from None
    return ReadyOut(database=session.get_bind().dialect.name)

"""Every route dependency, as an ``Annotated`` alias."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from sqlalchemy.orm import Session, sessionmaker

from service import metrics
from service.api.auth import client_address, project_for_key
from service.config import DEFAULT_PROJECT, Settings
from service.errors import TooManyAuthFailures, Unauthorized
from service.solving import SolverPool
from service.store import session_scope
from service.views import Renderer

# The cheap dependencies are ``async def``: FastAPI runs sync ones in the thread
# pool, and a thread hop per dependency is most of a cached read's cost.

__all__ = ["IdPath", "SessionDep", "SessionFactoryDep", "SettingsDep", "SolverDep", "RendererDep", "ProjectDep"]

_bearer = HTTPBearer(auto_error=False, description="An API key from SACPLAN_API_KEYS (only when keys are set).")


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_session_factory(request: Request) -> sessionmaker[Session]:
    return request.app.state.session_factory


def get_db(request: Request) -> Iterator[Session]:
    """The request's session: committed when the handler returns, rolled back if it raises."""
    yield from session_scope(request.app.state.session_factory)


async def get_solver(request: Request) -> SolverPool:
    return request.app.state.solver


async def get_renderer(request: Request) -> Renderer:
    return request.app.state.renderer


async def get_project(
    request: Request,
    settings: Annotated[Settings, Depends(get_settings)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    """The project the caller's API key belongs to (everything is 'default' when auth is off).

    An address with too many failed keys in the window gets 429 whatever key it sends.
    """
    if not settings.auth_enabled:
        return DEFAULT_PROJECT
    throttle = request.app.state.auth_failures
    address = client_address(request.scope)
    wait_s = throttle.retry_after_s(address)
    if wait_s is not None:
        metrics.AUTH_FAILURES.labels("throttled").inc()
        raise TooManyAuthFailures(throttle.failures, throttle.window_s, wait_s)
    project = project_for_key(settings, credentials.credentials) if credentials is not None else None
    if project is None:
        await run_in_threadpool(throttle.failed, address)  # a database write
        metrics.AUTH_FAILURES.labels("wrong_key").inc()
        raise Unauthorized()
    return project


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_db, scope="function")]
SessionFactoryDep = Annotated[sessionmaker[Session], Depends(get_session_factory)]
SolverDep = Annotated[SolverPool, Depends(get_solver)]
RendererDep = Annotated[Renderer, Depends(get_renderer)]
ProjectDep = Annotated[str, Depends(get_project)]
# Ids are opaque (service.store.ids): any string is taken, and one that names nothing of the caller's is 404.
IdPath = Annotated[str, Path(description="An opaque id, as the service answered it.")]

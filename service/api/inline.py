"""A plan or sweep request as the route needs it: when it arrived, and its body, large ones read off the event loop.

A request carrying its stats inline is as large as an upload (tens of MB). FastAPI
parsed it on the event loop into the request model, a dict per field, before the
route ran: ``/healthz`` stalled for half a second and more, and the route's clock
for ``time_limit_s`` started only after all that. Bodies over a MiB now reach the
route unparsed (``transport.deferred_body_route``) and are parsed and validated in
a render process, as uploads are (``store.store_request_body``); the clock starts
when the request's headers arrived (``transport.arrived_at``).
"""

from __future__ import annotations

import time
from typing import TypeVar

from fastapi import Request
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.schemas import StatsSource
from service.store import store_request_body
from service.transport import UploadLimits, arrived_at, deferred_body
from service.views import Renderer

__all__ = ["arrival_and_body"]

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
                                             max_time_limit_s=settings.max_time_limit_s)

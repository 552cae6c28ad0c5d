"""Large JSON request bodies left unparsed in the service process, for a route to hand to a worker process.

FastAPI parses a JSON body on the event loop before the route runs: for a
stats document of tens of MB that is most of a second with the loop stopped,
and the dict it makes would then be validated in this process too. A route of
a router built with ``route_class=DeferredBodyRoute`` gets an empty object as
its body instead when the body is over ``LARGE_BODY_BYTES``, and the bytes from
:func:`deferred_body`. Everything else FastAPI does with the body is unchanged
(which content types are JSON, the 422 for a small malformed body).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

__all__ = ["DeferredBodyRoute", "deferred_body_route", "deferred_body", "LARGE_BODY_BYTES"]

# Past this a body is parsed and validated in a worker process: ~0.2 s of CPU per MiB for stats, and the
# process hop (the bytes out, the columns back) costs a few ms.
LARGE_BODY_BYTES = 1 << 20


class _DeferredJSONRequest(Request):
    placeholder: dict[str, Any] = {}
    _whole_body: bytes | bytearray | None = None

    async def body(self) -> bytes | bytearray:
        # Starlette joins what it reads (the body and an empty end) into new bytes: for a large body a copy of tens
        # of MB on the event loop, 100 ms on a loaded machine. Read whole (BodySizeLimit did), the one chunk is it.
        if self._whole_body is None:
            chunks = [chunk async for chunk in self.stream() if chunk]
            self._whole_body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return self._whole_body

    async def json(self) -> Any:
        body = await self.body()
        if len(body) <= LARGE_BODY_BYTES:
            return await super().json()
        self.state.deferred_body = body
        return json.loads(json.dumps(self.placeholder))  # a fresh copy: the route may not change the class's


def deferred_body_route(placeholder: dict[str, Any]) -> type[APIRoute]:
    """A route class whose JSON body, when over ``LARGE_BODY_BYTES``, reaches the route through
    :func:`deferred_body`, and its body parameter is ``placeholder``."""
    request_class = type("DeferredJSONRequest", (_DeferredJSONRequest,), {"placeholder": placeholder})

    class Route(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def deferring_handler(request: Request) -> Response:
                return await handler(request_class(request.scope, request.receive))

            return deferring_handler

    return Route


DeferredBodyRoute = deferred_body_route({})
DeferredBodyRoute.__doc__ = "A route whose JSON body, when over ``LARGE_BODY_BYTES``, reaches it through :func:`deferred_body`."


def deferred_body(request: Request) -> bytes | None:
    """The raw JSON body the route's body parameter stands in for (then ``{}``), or None when it was parsed."""
    return getattr(request.state, "deferred_body", None)

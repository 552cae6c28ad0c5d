"""ASGI middleware: the request body size limit (413), enforced before any handler reads it; bodies that say
they are JSON are UTF-8 (RFC 8259 section 8.1: 415 for another charset, 400 for UTF-16 or UTF-32 or a byte order
mark, which Python's JSON reader would otherwise have guessed and read); the request's arrival time."""

from __future__ import annotations

import json
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BodySizeLimit", "replay_body", "arrived_at"]

_BOMS = {b"\xff\xfe\x00\x00": "a UTF-32 byte order mark", b"\x00\x00\xfe\xff": "a UTF-32 byte order mark",
         b"\xef\xbb\xbf": "a UTF-8 byte order mark", b"\xfe\xff": "a UTF-16 byte order mark",
         b"\xff\xfe": "a UTF-16 byte order mark"}


def arrived_at(scope: Scope) -> float | None:
    """``time.monotonic()`` when the request's headers had arrived (set by :class:`BodySizeLimit`), if known."""
    return scope.get("state", {}).get("arrived_at")


class BodySizeLimit:
    """Refuse bodies over ``max_bytes`` with 413, by Content-Length or by counting a streamed body."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope.setdefault("state", {})["arrived_at"] = time.monotonic()  # time limits count from here
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        json_body = _is_json(headers.get(b"content-type"))
        charset = _charset(headers.get(b"content-type")) if json_body else None
        if charset not in (None, "utf-8", "utf8"):
            await self._refuse(send, 415, f"request bodies are JSON in UTF-8 (RFC 8259 section 8.1); this one says "
                                          f"charset={charset}: send it as UTF-8 with content-type: application/json")
            return
        length = headers.get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                declared = -1
            if declared < 0:
                await self._refuse(send, 400, "Content-Length is not a non-negative integer")
                return
            if declared > self.max_bytes:
                await self._too_large(send)
                return
        # Read the whole body here (the app would anyway), counting as it streams in.
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        del chunks
        problem = _not_utf8(body) if json_body else None
        if problem is not None:
            await self._refuse(send, 400, f"the request body is not UTF-8 JSON (RFC 8259 section 8.1): {problem}")
            return
        await self.app(scope, replay_body(body, receive), send)

    async def _too_large(self, send: Send) -> None:
        await self._refuse(send, 413, f"request body is larger than this service's limit of {self.max_bytes} bytes")

    async def _refuse(self, send: Send, status: int, detail: str) -> None:
        body = json.dumps({"detail": detail}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def _is_json(content_type: bytes | None) -> bool:
    """Whether FastAPI would read a body of this content type as JSON (``application/json``, ``*/*+json``)."""
    if content_type is None:
        return False
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


def _charset(content_type: bytes) -> str | None:
    for param in content_type.split(b";")[1:]:
        name, _, value = param.partition(b"=")
        if name.strip().lower() == b"charset":
            return value.strip().strip(b'"').decode("latin-1").lower()
    return None


def _not_utf8(body: bytes) -> str | None:
    """What shows at its start that ``body`` is no UTF-8 JSON text; None when nothing does.

    Python's JSON reader guesses UTF-16 and UTF-32 from NUL bytes among the first four (JSON text starts with
    ASCII), and skips a byte order mark; invalid UTF-8 later in a body it refuses itself (400).
    """
    for bom, name in _BOMS.items():
        if body.startswith(bom):
            return f"it starts with {name}"
    if b"\x00" in body[:4]:
        return "it has NUL bytes among its first four: UTF-16 or UTF-32"
    return None


def replay_body(body: bytes, receive: Receive) -> Receive:
    """A receive callable that yields an already-read body once, then defers to ``receive``."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay

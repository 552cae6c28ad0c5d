"""ASGI middleware: the request body size limit (413), enforced before any handler reads it; bodies that say
they are JSON are UTF-8 (RFC 8259 section 8.1: 415 for another charset, 400 for UTF-16 or UTF-32 or a byte order
mark, which Python's JSON reader would otherwise have guessed and read); the request's arrival time."""

from __future__ import annotations

import asyncio
import json
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.transport.large_body import LARGE_BODY_BYTES

__all__ = ["BodySizeLimit", "replay_body", "arrived_at"]

_BOMS = {b"\xff\xfe\x00\x00": "a UTF-32 byte order mark", b"\x00\x00\xfe\xff": "a UTF-32 byte order mark",
         b"\xef\xbb\xbf": "a UTF-8 byte order mark", b"\xfe\xff": "a UTF-16 byte order mark",
         b"\xff\xfe": "a UTF-16 byte order mark"}


def arrived_at(scope: Scope) -> float | None:
    """``time.monotonic()`` when the request's headers had arrived (set by :class:`BodySizeLimit`), if known."""
    return scope.get("state", {}).get("arrived_at")


_LARGE_READS = 2


class BodySizeLimit:
    """Refuse bodies over ``max_bytes`` with 413, by Content-Length or by counting a streamed body; and bodies
    that would take the bodies held at once past ``held_bytes`` with 503 (``Retry-After``).

    A body is held from its first byte until its answer is sent: read here, then waiting for a render process
    and sent to it. Counting them bounds the service process's memory by the bodies in it, not by how many
    there are (eight 64 MiB uploads at once held half a GiB, and copies of it, before any was looked at).

    Bodies declaring more than ``LARGE_BODY_BYTES`` stream in two at a time (the others admitted wait, unread):
    every chunk read is work on the event loop, and four 63 MiB bodies at once held ``/healthz`` up to 102 ms,
    two at a time 33-74 ms. A client that stalls mid-body keeps its turn until ``SACPLAN_BODY_TIMEOUT_S``, as
    it keeps its share of ``held_bytes``.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, held_bytes: int | None = None, retry_after_s: int = 5):
        self.app = app
        self.max_bytes = max_bytes
        self.held_limit = held_bytes
        self.retry_after_s = retry_after_s
        self.held = 0  # bytes of the bodies this process holds now
        self._large_reads: asyncio.Semaphore | None = None  # bodies over LARGE_BODY_BYTES read at once: at most 2

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
        declared = 0
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
        if not await self._admit(send, declared):
            return
        taken = [declared]  # bytes this request holds in self.held: what it declared, then what it sent
        try:
            if declared > LARGE_BODY_BYTES:  # each chunk read is event-loop work: two large bodies stream at a time
                if self._large_reads is None:
                    self._large_reads = asyncio.Semaphore(_LARGE_READS)
                async with self._large_reads:
                    body = await self._read(receive, send, taken)
            else:
                body = await self._read(receive, send, taken)
            if body is None:
                return
            problem = _not_utf8(body) if json_body else None
            if problem is not None:
                await self._refuse(send, 400, f"the request body is not UTF-8 JSON (RFC 8259 section 8.1): {problem}")
                return
            replay = replay_body(body, receive)
            del body  # the app's own copy (Starlette joins what it reads) is then the only one held
            await self.app(scope, replay, send)
        finally:
            self.held -= taken[0]

    async def _read(self, receive: Receive, send: Send, taken: list[int]) -> bytes | bytearray | None:
        """The whole body, counted as it streams in (the app would read it anyway); None when answered here.

        Appended to one growing buffer as it comes: a list of the server's chunks, joined at the end, left the heap
        holding about the body's size again after they were freed; a buffer made at its Content-Length first was
        zeroed page by page in one go (tens of ms per 64 MiB on the event loop, and several bodies arrive at once),
        while growing it lets the kernel move its pages (``mremap``) as the chunks are copied in. A body over
        ``LARGE_BODY_BYTES`` is handed on as that buffer, not copied into ``bytes``: a copy of tens of MB on the
        event loop held it for 100 ms on a loaded machine."""
        buffer = bytearray()
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(send)
                return None
            if size > taken[0]:  # past what it declared (or it declared nothing): held as it comes
                if not await self._admit(send, size - taken[0]):
                    return None
                taken[0] = size
            buffer += chunk
            more = message.get("more_body", False)
        return buffer if size > LARGE_BODY_BYTES else bytes(buffer)

    async def _admit(self, send: Send, size: int) -> bool:
        """Count ``size`` more bytes as held, or refuse the request (False) when they do not fit."""
        if self.held_limit is not None and size and self.held + size > self.held_limit:
            if size > self.held_limit:  # would never fit
                await self._refuse(send, 413, f"request body is larger than the {self.held_limit} bytes this "
                                              f"service holds at once (SACPLAN_BODY_MEMORY_MB)")
            else:
                await self._refuse(send, 503, f"the request bodies this service is reading and validating hold the "
                                              f"memory set aside for them (SACPLAN_BODY_MEMORY_MB); retry in "
                                              f"{self.retry_after_s} s", headers=[(b"retry-after",
                                                                                   str(self.retry_after_s).encode())])
            return False
        self.held += size
        return True

    async def _too_large(self, send: Send) -> None:
        await self._refuse(send, 413, f"request body is larger than this service's limit of {self.max_bytes} bytes")

    async def _refuse(self, send: Send, status: int, detail: str,
                      headers: list[tuple[bytes, bytes]] = ()) -> None:
        body = json.dumps({"detail": detail}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close"), *headers]})
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
    """A receive callable that yields an already-read body once, then defers to ``receive``; it holds the body
    only until then."""
    held = [body]

    async def replay() -> Message:
        if held:
            return {"type": "http.request", "body": held.pop(), "more_body": False}
        return await receive()

    return replay

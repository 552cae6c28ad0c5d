"""Cached plan responses answered before FastAPI: the bytes the normal path sent, kept in a bounded LRU.

A cached plan read through FastAPI costs about a millisecond of CPU in routing,
dependencies and validation, against tens of microseconds for the database
read itself. :class:`PlanFastPath` sits in front of the routes and, for
``GET /v1/plans/{id}`` and ``POST /v1/plans``, replays the response the normal
path gave to the same request (same project, same path and query, same body
and content type) when that response was a cache hit (``200``, ``X-Cache: hit``).

What it never changes:

* access control: with API keys the caller's key is checked (constant time,
  the same function the routes use) and an entry answers only the project that
  stored it; any other caller, and any missing or bad key, goes the normal way
  (404 / 401);
* deletion: ``DELETE /v1/stats/{id}`` drops that stats' entries here, and every
  hit first re-reads the plan's row (one primary-key read) and is served only
  if it still exists, with the same stats, creation time and project. So an
  entry in another worker process, or another replica on the same database,
  never outlives its plan.

Everything else (misses, errors, other routes) falls through to the app.
"""

from __future__ import annotations

import json
import logging
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, bindparam, select
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import metrics
from service.api.auth import client_address, project_for_key
from service.api.throttle import AuthThrottle
from service.config import DEFAULT_PROJECT, Settings
from service.store import ID_PATTERN, PlanRecord, StatsRecord
from service.times import iso_utc
from service.transport import replay_body

__all__ = ["CachedResponse", "PlanResponseCache", "PlanFastPath"]

log = logging.getLogger("service.fastpath")

_ID = ID_PATTERN[1:-1]  # an opaque id (service.store.ids); other strings name nothing and go the normal way (404)
_PLAN_PATH = re.compile(f"/v1/plans/{_ID}")
_STATS_PATH = re.compile(f"/v1/stats/({_ID})")
# Plan requests are a few hundred bytes; bigger bodies are not worth a key.
_MAX_KEYED_BODY_BYTES = 4096


@dataclass(frozen=True, slots=True)
class CachedResponse:
    """One response as the normal path sent it, and the plan row it showed."""

    plan_id: str
    stats_id: str
    row: tuple  # (stats_id, created_at, project) as the database driver returned them when stored
    start: Message  # http.response.start: status and headers
    body: bytes


class PlanResponseCache:
    """A least-recently-used map of request keys to :class:`CachedResponse`, bounded in entries and bytes."""

    def __init__(self, max_entries: int, max_bytes: int):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.size_bytes = 0
        self.hits = 0  # responses answered from here
        self._entries: OrderedDict[tuple, CachedResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: tuple) -> CachedResponse | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: tuple, entry: CachedResponse) -> None:
        if len(entry.body) > self.max_bytes or self.max_entries <= 0:
            return
        self.pop(key)
        self._entries[key] = entry
        self.size_bytes += len(entry.body)
        while len(self._entries) > self.max_entries or self.size_bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.size_bytes -= len(old.body)

    def pop(self, key: tuple) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.size_bytes -= len(old.body)

    def drop_stats(self, stats_id: str) -> None:
        """Forget every response showing a plan of ``stats_id``."""
        for key in [k for k, e in self._entries.items() if e.stats_id == stats_id]:
            self.pop(key)


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


class PlanFastPath:
    """ASGI middleware answering repeated cached plan reads from :class:`PlanResponseCache`."""

    def __init__(self, app: ASGIApp, *, settings: Settings, engine: Engine, cache: PlanResponseCache,
                 throttle: AuthThrottle):
        self.app = app
        self.throttle = throttle
        self.settings = settings
        self.engine = engine
        self.cache = cache
        self._plan_row = (
            select(PlanRecord.stats_id, PlanRecord.created_at, StatsRecord.project)
            .join(StatsRecord, StatsRecord.id == PlanRecord.stats_id)
            .where(PlanRecord.id == bindparam("plan_id"))
        )
        self._plan_row_sql = self._plan_row.compile(dialect=engine.dialect)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.cache.max_entries <= 0:
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        if method == "GET" and _PLAN_PATH.fullmatch(path):
            await self._serve(scope, receive, send, ("GET", path, scope["query_string"]))
        elif method == "POST" and path == "/v1/plans":
            body = await _read_body(receive)
            if body is None:  # the client went away
                return
            replay = replay_body(body, receive)
            if len(body) > _MAX_KEYED_BODY_BYTES:
                del body  # held by the app alone from here
                await self.app(scope, replay, send)
                return
            key = ("POST", path, scope["query_string"], _header(scope, b"content-type"), body)
            await self._serve(scope, replay, send, key)
        elif method == "DELETE" and (m := _STATS_PATH.fullmatch(path)):
            await self.app(scope, receive, self._on_success(send, 204, lambda: self.cache.drop_stats(m[1])))
        else:
            await self.app(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, request_key: tuple) -> None:
        project = self._project(scope)
        if project is None:  # no or bad key: the routes answer 401
            await self.app(scope, receive, send)
            return
        key = (project, *request_key)
        entry = self.cache.get(key)
        if entry is not None:
            try:
                stored = self._still_stored(entry)  # also: the row is in the caller's project
            except Exception:  # the database is unwell: the routes decide what to answer
                log.debug("fast path: plan row check failed", exc_info=True)
                stored = False
            if stored:
                self.cache.hits += 1
                metrics.CACHE_HITS.labels("fastpath").inc()
                await send(entry.start)
                await send({"type": "http.response.body", "body": entry.body})
                return
            self.cache.pop(key)
        await self.app(scope, receive, self._capture(send, key, project))

    def _project(self, scope: Scope) -> str | None:
        """The caller's project, exactly as ``deps.get_project`` decides it; None for a missing or bad key."""
        if not self.settings.auth_enabled:
            return DEFAULT_PROJECT
        if self.throttle.retry_after_s(client_address(scope)) is not None:
            return None  # the routes answer 429
        header = _header(scope, b"authorization")
        if not header:
            return None
        scheme, _, credentials = header.decode("latin-1").partition(" ")
        credentials = credentials.strip()
        if not scheme or not credentials or scheme.lower() != "bearer":
            return None
        return project_for_key(self.settings, credentials)

    def _still_stored(self, entry: CachedResponse) -> bool:
        """The plan row behind ``entry`` is still there: the same row (creation time), stats and project."""
        return self._raw_row(entry.plan_id) == entry.row

    def _raw_row(self, plan_id: str) -> tuple | None:
        """The plan's (stats_id, created_at, project) straight from the driver.

        Once per hit, so on the bare DBAPI connection: a Core execute costs ~150 us
        of result processing here, this ~30 us. Values are compared only with
        values read the same way.
        """
        sql = self._plan_row_sql
        params = sql.construct_params({"plan_id": plan_id})
        args = tuple(params[name] for name in sql.positiontup) if sql.positional else params
        conn = self.engine.raw_connection()
        try:
            cursor = conn.cursor()
            cursor.execute(sql.string, args)
            row = cursor.fetchone()
            cursor.close()
        finally:
            conn.close()
        return tuple(row) if row is not None else None

    def _row_as_served(self, plan_id: str) -> tuple | None:
        """The plan's (stats_id, created_at as in a response body, project), typed by SQLAlchemy."""
        with self.engine.connect() as conn:
            row = conn.execute(self._plan_row, {"plan_id": plan_id}).first()
        if row is None:
            return None
        return row.stats_id, iso_utc(row.created_at), row.project

    def _capture(self, send: Send, key: tuple, project: str) -> Send:
        """``send``, also keeping a complete ``200`` ``X-Cache: hit`` plan response for ``key``."""
        start: Message | None = None
        chunks: list[bytes] = []

        async def capture(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                if message["status"] == 200 and (b"x-cache", b"hit") in [tuple(h) for h in message.get("headers", [])]:
                    start = message
            await send(message)
            if message["type"] == "http.response.body" and start is not None:
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    self._remember(key, project, start, b"".join(chunks))

        return capture

    def _remember(self, key: tuple, project: str, start: Message, body: bytes) -> None:
        try:
            plan = json.loads(body)
            plan_id, stats_id, created_at = plan["id"], plan["stats_id"], plan["created_at"]
        except (ValueError, KeyError, TypeError):
            return  # not a stored plan: nothing to keep
        if not isinstance(plan_id, str) or not isinstance(stats_id, str):
            return
        try:
            # Keep it only if the row is still the one this body shows (it may have been deleted meanwhile).
            if self._row_as_served(plan_id) != (stats_id, created_at, project):
                return
            row = self._raw_row(plan_id)
        except Exception:  # the answer is already sent; only the keeping failed
            log.debug("fast path: could not keep plan %s", plan_id, exc_info=True)
            return
        if row is not None:
            self.cache.put(key, CachedResponse(plan_id, stats_id, row, dict(start), body))

    @staticmethod
    def _on_success(send: Send, status: int, action: Callable[[], Any]) -> Send:
        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == status:
                action()
            await send(message)

        return watch


async def _read_body(receive: Receive) -> bytes | bytearray | None:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            # one chunk (BodySizeLimit read it whole) is the body: a large one is not copied on the event loop
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)

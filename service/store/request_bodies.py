"""Plan and sweep requests too large to read in the service process: read in a render process, their inline
stats stored as an upload would be, within the request's time limit.

The time limit (``time_limit_s``) bounds the whole request from its arrival. Validating, hashing and
storing tens of MB of inline stats takes seconds, so it can use the limit up before any solve: then the
answer goes out at the limit, saying so (:class:`StatsNotInTime`), and nothing is stored. The render process
is told the deadline and stops at its next step (between parsing, validation, and each module of the
stored text); whatever it makes after the answer has gone is thrown away. A user who sees this answer
uploads the stats with ``POST /v1/stats`` (no time limit) and plans by ``stats_id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from service.errors import InvalidInput
from service.schemas import StatsSource
from service.store.stats import (database_of, in_render_process, keep_spooled_job, parse_body_file, raise_unless_ok,
                                 spool, stats_columns)
from service.transport import UploadLimits, check_time_limit

__all__ = ["store_request_body", "prepare_request_job", "StatsNotInTime", "claim"]

log = logging.getLogger(__name__)

_LOOK_S = 0.05  # how often the service looks whether the render process has told the request's time limit


class StatsNotInTime(Exception):
    """The request's time limit passed before its inline stats were validated and stored: nothing was stored.

    ``request`` is the request's own fields (its ``stats`` an empty stand-in), for the answer.
    """

    def __init__(self, request: StatsSource):
        super().__init__("time_limit_s passed before the inline stats were validated and stored")
        self.request = request


async def store_request_body(factory: sessionmaker[Session], run_in_process: Callable[..., Awaitable[Any]],
                             project: str, body: bytes, model: type[StatsSource], *, limits: UploadLimits,
                             max_time_limit_s: float, started: float) -> StatsSource:
    """A plan or sweep request (``model``) too large to read in the service process, as the route would have
    had it, with its inline ``stats`` stored (as ``stats_id_of`` would) and named by ``stats_id``.

    The request is parsed and validated, its time limit checked and its stats validated in another process
    (:func:`prepare_request_job`), as an upload over a MiB is: only the request's other fields and the stats'
    columns come back. Errors are those of the small path, in its order: the request's fields (422), its
    ``time_limit_s``, then the stats (413, 422 under ``body.stats``). :class:`StatsNotInTime` at the time
    limit (from ``started``, ``time.monotonic()`` at the request's arrival) if the stats are not stored by then.
    """
    body_file, document_file = await run_in_threadpool(spool, body)
    limit_file, claim_file = document_file + ".limit", document_file + ".claim"
    started_epoch = time.time() - (time.monotonic() - started)
    job = asyncio.ensure_future(in_render_process(run_in_process, prepare_request_job, len(body), body_file,
                                                  document_file, limit_file, model, limits, max_time_limit_s,
                                                  started_epoch, database_of(factory), project))
    paths = (body_file, document_file, limit_file, limit_file + ".part", claim_file)
    try:
        late = await _done_or_late(job, limit_file, claim_file, started)
    except BaseException:  # the client went away: the job's files go once it is done
        job.add_done_callback(lambda done: _let_go(done, paths))
        raise
    if late is not None:
        job.add_done_callback(lambda done: _let_go(done, paths))
        raise StatsNotInTime(model.model_validate({**late, "stats": {}}))
    try:
        outcome = raise_unless_ok(job.result(), body)
        if outcome[0] == "time_limit":
            raise StatsNotInTime(model.model_validate({**outcome[1], "stats": {}}))
        fields, row_id = outcome[1], outcome[2]
        if row_id is not None:
            fields = {**fields, "stats_id": row_id}
    finally:
        _unlink(paths)
    return model.model_validate(fields)


async def _done_or_late(job: asyncio.Future, limit_file: str, claim_file: str,
                        started: float) -> dict[str, Any] | None:
    """None once ``job`` is done; the request's fields if its time limit passes first (known once the render
    process has read the request and written them to ``limit_file``) and the job has not begun to store the
    stats (whichever of the two claims ``claim_file`` first decides)."""
    deadline, fields = None, None
    while not job.done():
        wait_s = _LOOK_S if deadline is None else max(deadline - time.monotonic(), 0.0)
        await asyncio.wait({job}, timeout=wait_s)
        if job.done():
            return None
        if deadline is None:
            told = _told(limit_file)
            if told is not None:
                deadline, fields = started + told["time_limit_s"], told["fields"]
        if deadline is not None and time.monotonic() >= deadline:
            if claim(claim_file):
                return fields
            deadline = float("inf")  # the job is storing them: its answer, a moment after the limit
    return None


def claim(path: str) -> bool:
    """Whether this caller is the first to claim ``path`` (made atomically: of the service answering at the
    time limit and the render process storing the stats, only one goes ahead)."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    return True


def _told(limit_file: str) -> dict[str, Any] | None:
    try:
        with open(limit_file, encoding="utf-8") as told:
            return json.load(told)
    except FileNotFoundError:
        return None


def _let_go(job: asyncio.Future, paths: tuple[str, ...]) -> None:
    """A job nobody waits for any more: its files removed, its outcome (whatever it is) thrown away."""
    if not job.cancelled() and job.exception() is not None:
        log.info("a request's render job ended after its answer: %r", job.exception())
    _unlink(paths)


def _unlink(paths: tuple[str, ...]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)


def prepare_request_job(body_file: str, document_file: str, limit_file: str, model: type[StatsSource],
                        limits: UploadLimits, max_time_limit_s: float, started_epoch: float, database_url: str,
                        project: str) -> tuple:
    """In a render process: ``("ok", fields, stats_id)`` for a valid plan or sweep request ``model`` (the body in
    ``body_file``): its fields but ``stats``, and the id of its inline stats stored through ``database_url`` (their
    text written to ``document_file`` on the way), or None; ``("time_limit", fields)`` when its time limit (from
    ``started_epoch``, ``time.time()`` at its arrival) passed first, nothing stored; else what is wrong with it.
    Once the request's own fields are valid they go to ``limit_file`` with its ``time_limit_s``, for the service to
    keep the time; the stats are stored only if this job claims ``<document_file>.claim`` before the service."""
    parsed = parse_body_file(body_file)
    if parsed[0] != "ok":
        return parsed
    doc = parsed[1].pop()
    stats = doc.pop("stats", None)
    try:  # the request's own fields, the stats standing in as any object (they are validated as stats below)
        request = model.model_validate({**doc, "stats": {}} if isinstance(stats, dict) else
                                       {**doc, **({} if stats is None else {"stats": stats})})
    except ValidationError as exc:
        return "request_invalid", [_request_error(e) for e in exc.errors(include_url=False, include_context=False)]
    fields = request.model_dump(mode="json", exclude_unset=True, exclude={"stats"})
    try:
        check_time_limit(request.time_limit_s, max_time_limit_s)
    except InvalidInput as exc:
        return "invalid", exc.message, exc.errors
    if stats is None:
        return "ok", fields, None
    _tell(limit_file, {"fields": fields, "time_limit_s": request.time_limit_s})
    holder, stats = [stats], None  # only the holder has the stats now
    outcome = stats_columns(holder, limits, document_file, loc=("body", "stats"),
                            until=started_epoch + request.time_limit_s)
    if outcome[0] != "ok":
        return ("time_limit", fields) if outcome[0] == "time_limit" else outcome
    if time.time() >= started_epoch + request.time_limit_s or not claim(document_file + ".claim"):
        return "time_limit", fields
    row_id, _ = keep_spooled_job(database_url, project, outcome[1], document_file)
    return "ok", fields, row_id


def _tell(limit_file: str, told: dict[str, Any]) -> None:
    with open(limit_file + ".part", "w", encoding="utf-8") as out:
        json.dump(told, out)
    os.replace(limit_file + ".part", limit_file)  # the service never reads half of it


def _request_error(error: dict[str, Any]) -> dict[str, Any]:
    value = error.get("input")
    if isinstance(value, (dict, list, str)) and len(value) > 64:  # a large body's part is not sent back whole
        value = value[:64] if isinstance(value, (list, str)) else type(value)()
    return {"type": error["type"], "loc": ("body", *error["loc"]), "msg": error["msg"], "input": value}

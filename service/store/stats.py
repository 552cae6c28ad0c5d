"""Stats uploads: validated, summarised, kept once per project and content hash; and read back.

One path for ``POST /v1/stats`` and for the stats a plan or sweep request
carries inline (``stats`` instead of ``stats_id``): the same validation (422
naming the field), the same identity (the same document again is the same
upload) and the same stored row.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

import planner
from planner import baseline_peak_bytes, compute_ms
from service.errors import InvalidInput, NotFound, PayloadTooLarge, RenderMemoryExceeded
from service.schemas import StatsSource
from service.store.db import make_engine, make_sessionmaker, write_gate
from service.store.ids import is_id, shown_id
from service.store.models import StatsRecord, StatsTag
from service.store.ranges import check_in_range
from service.text import check_storable
from service.transport import UploadLimits, check_upload

__all__ = ["get_stats", "stats_document", "new_stats_record", "stats_row_fields", "keep_stats", "store_stats",
           "store_stats_body", "prepare_body_job", "stats_id_of", "spooled", "keep_spooled", "in_render_process",
           "raise_unless_ok", "parse_body_file", "stats_columns", "OutOfTime", "database_of",
           "keep_spooled_job"]


def get_stats(session: Session, project: str, stats_id: str) -> StatsRecord:
    """The project's stats upload ``stats_id``; another project's id, or no id at all, is as absent as a missing one."""
    row = session.get(StatsRecord, stats_id) if is_id(stats_id) else None
    if row is None or row.project != project:
        raise NotFound(f"stats_id {shown_id(stats_id)} does not exist")
    return row


def stats_document(factory: sessionmaker[Session], stats_id: str, *,
                   document: bool = True) -> tuple[str | None, dict[str, Any]]:
    """The stored document a solve reads (None with ``document=False``: tens of MB a request out of time does
    not need), and the upload's no-plan figures (world_size 1)."""
    columns = [StatsRecord.baseline_peak_bytes, StatsRecord.compute_ms]
    with factory() as session:
        row = session.execute(
            select(*columns, *([StatsRecord.document] if document else [])).where(StatsRecord.id == stats_id)
        ).first()
    if row is None:
        raise NotFound(f"stats_id {shown_id(stats_id)} does not exist")
    figures = {"baseline_peak_bytes": row.baseline_peak_bytes, "compute_ms": row.compute_ms}
    return (row.document if document else None), figures


def new_stats_record(project: str, doc: dict[str, Any], *, loc: Sequence[str] = (),
                     limits: UploadLimits | None = None) -> StatsRecord:
    """The row for ``doc``, not yet stored; InvalidInput (422) naming the field, under ``loc`` in the request.

    PayloadTooLarge (413) first, before any validation, when ``doc`` passes ``limits``.
    """
    return _record(project, stats_row_fields(doc, loc=loc, limits=limits))


def stats_row_fields(doc: dict[str, Any], *, loc: Sequence[str] = (),
                     limits: UploadLimits | None = None) -> dict[str, Any]:
    """The stored columns of ``doc`` (plain data, so a worker process can send them back) and its ``tags``.

    Raises as :func:`new_stats_record` does.
    """
    return _row_fields([doc], loc, limits)


def _row_fields(holder: list[dict[str, Any]], loc: Sequence[str], limits: UploadLimits | None,
                document_file: str | None = None, until: float | None = None) -> dict[str, Any]:
    """:func:`stats_row_fields` of the one document in ``holder``: taken out, and let go once validated when
    nobody else holds it (a worker's decoded body is a few times the body's size). With ``document_file`` the
    document's text is written there instead of returned (a worker's answer then needs no copy of it). Past
    ``until`` (``time.time()``) it stops between steps with :class:`OutOfTime`."""
    doc = holder.pop()
    if limits is not None:
        check_upload(doc, limits, loc)
    source_format = "v1" if doc.get("format") else "torch"
    _check_time(until)
    try:
        stats = planner.parse_stats(doc)
    except planner.StatsError as exc:
        where = f" ({'.'.join(loc)})" if loc else ""
        errors = [{**e, "loc": [*loc, *e.get("loc", ())]} for e in exc.errors]
        raise InvalidInput(f"invalid stats{where}: {exc}", errors=errors) from None
    del doc
    _check_time(until)
    # The columns the document's text goes to as such (the document itself is stored as escaped JSON).
    check_storable(stats.metadata.model_name, [*loc, "metadata", "model_name"])
    for key, value in stats.metadata.tags.items():
        check_storable(key, [*loc, "metadata", "tags", key])
        check_storable(value, [*loc, "metadata", "tags", key])
    figures = {
        "module_count": len(stats.modules), "op_count": sum(len(m.ops or ()) for m in stats.modules),
        "baseline_peak_bytes": baseline_peak_bytes(stats), "compute_ms": compute_ms(stats),
    }
    for name, value in figures.items():  # sums of bounded fields can still pass what a column holds
        check_in_range(StatsRecord, name, value, what=_DERIVED[name], loc=[*loc, "modules"])
    fields = {"model_name": stats.metadata.model_name, "source_format": source_format, **figures,
              "tags": dict(stats.metadata.tags)}
    if document_file is not None:
        return {**fields, "content_hash": _write_document(stats, document_file, until)}
    document = stats.canonical_json()  # once: planner.stats_hash(stats) is the SHA-256 of this same text
    return {**fields, "content_hash": hashlib.sha256(document.encode()).hexdigest(), "document": document}


class OutOfTime(Exception):
    """A job's time limit passed before it was done (:func:`stats_columns` answers ``("time_limit",)``)."""


def _check_time(until: float | None) -> None:
    if until is not None and time.time() >= until:
        raise OutOfTime


def _write_document(stats: planner.Stats, path: str, until: float | None = None) -> str:
    """Write the canonical text of ``stats`` to ``path`` a module at a time; its SHA-256 (planner.stats_hash)."""
    digest = hashlib.sha256()
    with open(path, "wb") as out:
        for part in stats.canonical_json_parts():
            _check_time(until)
            data = part.encode()
            digest.update(data)
            out.write(data)
    return digest.hexdigest()


_DERIVED = {
    "module_count": "the stats' modules",
    "op_count": "the ops of all the stats' modules",
    "baseline_peak_bytes": "the step's peak memory without checkpointing: parameters, gradients, optimizer "
                           "state and activations live at once, summed over the modules",
    "compute_ms": "the step's forward + backward time: the root's fw_ms + bw_ms",
}


def _record(project: str, fields: dict[str, Any]) -> StatsRecord:
    columns = dict(fields)
    tags = columns.pop("tags")
    row = StatsRecord(project=project, **columns)
    row.tags = [StatsTag(key=k, value=v) for k, v in tags.items()]
    return row


def keep_stats(session: Session, project: str, row: StatsRecord) -> tuple[StatsRecord, bool]:
    """``row`` stored now, or the project's upload stored before with the same content hash.

    Returns the row and whether this call stored it. Tries the insert first (three
    statements: the row, its tags, the commit the caller makes): new uploads are the
    common case under load; a known document costs a rolled-back insert and a read.
    ``session`` must hold no other pending work (it is rolled back on a duplicate).
    """
    session.add(row)
    try:
        session.flush()
    except IntegrityError:
        session.rollback()
        same_document = select(StatsRecord).where(StatsRecord.project == project,
                                                  StatsRecord.content_hash == row.content_hash)
        return session.execute(same_document).scalar_one(), False
    return row, True


# Documents up to this many modules + ops (all real models' per-block stats, the examples) are validated on
# the event loop: well under a millisecond, less than the two thread hops it saves. Larger ones in a thread.
_INLINE_SIZE = 2000


async def store_stats(factory: sessionmaker[Session], project: str, doc: dict[str, Any], *,
                      loc: Sequence[str] = (), limits: UploadLimits) -> tuple[StatsRecord, bool]:
    """The project's upload of ``doc``: stored now, or the one stored before (same content hash).

    Limits first (413), then validation (422), then one short write transaction in
    a thread, through the database's write gate. Returns the row (its tags loaded)
    and whether this call stored it.
    """
    size = check_upload(doc, limits, loc)
    if size <= _INLINE_SIZE:
        row = new_stats_record(project, doc, loc=loc)
    else:
        row = await run_in_threadpool(new_stats_record, project, doc, loc=loc)
    return await run_in_threadpool(_keep, factory, project, row)


async def store_stats_body(factory: sessionmaker[Session], run_in_process: Callable[..., Awaitable[Any]],
                           project: str, body: bytes, *, limits: UploadLimits) -> tuple[StatsRecord, bool]:
    """As :func:`store_stats`, for a request body too large to read in the service process.

    Parsing, the limits and validation run in another process (:func:`prepare_body_job`, through
    ``run_in_process``: the render pool's ``Renderer.run``): seconds of
    CPU for a document of tens of MB, which in a thread of this process held the GIL for up to a second at
    a time and stalled the event loop (``/healthz`` and cached reads included). Only the columns come back.
    """
    async with spooled(body) as (body_file, document_file):
        outcome = raise_unless_ok(await in_render_process(run_in_process, prepare_body_job, len(body), body_file,
                                                          document_file, limits, database_of(factory), project), body)
        return await run_in_threadpool(_stored, factory, outcome[1]), outcome[2]


def database_of(factory: sessionmaker[Session]) -> str:
    """The URL a render process stores an upload through (:func:`keep_spooled_job`).

    Stored from a thread of this process, reading the document's text back (tens of MB decoded) and binding it
    into the insert (the database driver copies it) each held the GIL for 100-200 ms at a time: the event loop,
    ``/healthz`` included, stood still meanwhile. The write gate is a file lock, so it holds across processes.
    """
    return factory.kw["bind"].url.render_as_string(hide_password=False)


_factories: dict[str, sessionmaker[Session]] = {}  # a render process's database, made on its first write


def keep_spooled_job(database_url: str, project: str, columns: dict[str, Any], document_file: str) -> tuple[str, bool]:
    """In a render process: :func:`keep_spooled`; the row's id and whether it was stored now."""
    factory = _factories.get(database_url)
    if factory is None:
        factory = _factories[database_url] = make_sessionmaker(make_engine(database_url))
    row, inserted = keep_spooled(factory, project, columns, document_file)
    return row.id, inserted


def _stored(factory: sessionmaker[Session], row_id: str) -> StatsRecord:
    """The upload ``row_id`` with its tags, without its document."""
    with factory() as session:
        row = session.get(StatsRecord, row_id)
        row.tags  # noqa: B018 - loaded while the session is open
        return row


@asynccontextmanager
async def spooled(body: bytes) -> AsyncIterator[tuple[str, str]]:
    """``body`` in a temporary file, and an empty one for the document's text: a render process reads the one
    and writes the other. Passed as job arguments they were pickled, and the executor's feeder thread keeps the
    last message it sent (the body again) until it sends another; the text, tens of MB more, came back the same
    way."""
    paths = await run_in_threadpool(spool, body)
    try:
        yield paths
    finally:
        for path in paths:
            with contextlib.suppress(OSError):
                os.unlink(path)


def spool(body: bytes) -> tuple[str, str]:
    paths = []
    try:
        for data in (body, b""):
            handle, path = tempfile.mkstemp(prefix="sacplan-body-", suffix=".json")
            paths.append(path)
            with os.fdopen(handle, "wb") as out:
                out.write(data)
    except BaseException:
        for path in paths:
            os.unlink(path)
        raise
    return paths[0], paths[1]


def keep_spooled(factory: sessionmaker[Session], project: str, columns: dict[str, Any],
                 document_file: str) -> tuple[StatsRecord, bool]:
    with open(document_file, encoding="utf-8") as text:
        document = text.read()
    return _keep(factory, project, _record(project, {**columns, "document": document}))


async def in_render_process(run_in_process: Callable[..., Awaitable[Any]], job: Callable[..., tuple], size: int,
                            *args: Any) -> tuple:
    """``job(*args)`` in a render process; 413 when validating the body (``size`` bytes) needs more than its
    memory cap."""
    try:
        return await run_in_process(job, *args)
    except RenderMemoryExceeded as exc:
        message = (f"the request body ({size} bytes) needs more memory to read and validate than this service "
                   f"allows per request: {exc.message}")
        raise PayloadTooLarge(message, errors=[{"loc": ["body"], "msg": message, "input": size}]) from None


def raise_unless_ok(outcome: tuple, body: bytes) -> tuple:
    """A worker's ``("ok", ...)``, or its account of what is wrong raised as the small path would."""
    kind = outcome[0]
    if kind == "json_invalid":  # as FastAPI words a body it cannot parse, so the same handler explains it
        _, message, position = outcome
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", position), "msg": "JSON decode error",
                                       "input": {}, "ctx": {"error": message}}], body=body.decode("utf-8", "replace"))
    if kind == "unreadable":  # FastAPI's answer to any other parser failure, its cause attached, as here
        raise HTTPException(400, detail="There was an error parsing the body") from outcome[1]
    if kind == "not_object":  # the value itself (over a MiB) is not sent back: an empty one of its JSON type
        raise RequestValidationError([{"type": "dict_type", "loc": ("body",), "msg": "Input should be a valid "
                                       "dictionary", "input": outcome[1]}])
    if kind == "request_invalid":
        raise RequestValidationError(outcome[1])
    if kind == "too_large":
        raise PayloadTooLarge(outcome[1], errors=outcome[2])
    if kind == "invalid":
        raise InvalidInput(outcome[1], errors=outcome[2])
    return outcome


def parse_body_file(body_file: str) -> tuple:
    """``("ok", [doc])`` of the body in ``body_file`` (in a list, so the validation can let it go), or what is
    wrong with the body."""
    with open(body_file, "rb") as source:
        body = source.read()
    try:
        doc = json.loads(body)
    except json.JSONDecodeError as exc:
        return "json_invalid", exc.msg, exc.pos
    except (RecursionError, ValueError) as exc:  # too deeply nested; not UTF-8 (UnicodeDecodeError)
        return "unreadable", exc
    del body
    if not isinstance(doc, dict):
        return "not_object", type(doc)()
    return "ok", [doc]


def stats_columns(holder: list[dict[str, Any]], limits: UploadLimits, document_file: str,
                  loc: Sequence[str] = (), until: float | None = None) -> tuple:
    """``("ok", columns)`` of the stats document in ``holder`` (its text written to ``document_file``), else
    what is wrong with it; ``("time_limit",)`` once ``time.time()`` passes ``until`` (checked between steps)."""
    try:
        return "ok", _row_fields(holder, loc, limits, document_file, until)
    except OutOfTime:
        return ("time_limit",)
    except PayloadTooLarge as exc:
        return "too_large", exc.message, exc.errors
    except InvalidInput as exc:
        return "invalid", exc.message, exc.errors


def prepare_body_job(body_file: str, document_file: str, limits: UploadLimits, database_url: str,
                     project: str) -> tuple:
    """In a render process: ``("ok", row_id, inserted)`` for a valid stats document (the body in ``body_file``;
    its canonical text written to ``document_file``), stored through ``database_url`` (or found there), else what
    is wrong with it. One job: between two, a render process holding the validation's memory is replaced."""
    parsed = parse_body_file(body_file)
    outcome = stats_columns(parsed[1], limits, document_file) if parsed[0] == "ok" else parsed
    if outcome[0] != "ok":
        return outcome
    return ("ok", *keep_spooled_job(database_url, project, outcome[1], document_file))


def _keep(factory: sessionmaker[Session], project: str, row: StatsRecord) -> tuple[StatsRecord, bool]:
    with write_gate(factory), factory() as session:
        kept, inserted = keep_stats(session, project, row)
        session.commit()
        return kept, inserted


async def stats_id_of(factory: sessionmaker[Session], project: str, request: StatsSource,
                      limits: UploadLimits) -> str:
    """The ``stats_id`` a plan or sweep request names, storing its inline ``stats`` first if it has them."""
    if request.stats is None:
        return request.stats_id
    row, _ = await store_stats(factory, project, request.stats, loc=("body", "stats"), limits=limits)
    return row.id

"""One solve per set of plan keys, across worker processes and replicas, through a claim in the database.

The first request to insert a :class:`~service.store.models.SolveClaim` row under the
solve's key runs the solver; identical requests anywhere (another ``--workers``
process, another replica on the same database) find the row and wait for the
owner to write the solver's answer into it, then answer from that same
answer. The owner keeps the claim's expiry ahead of the clock while it works
(a heartbeat), so the claim of a process that crashed lapses within
``claim_ttl_s`` and the next request takes it over. An answer stays readable
for ``linger_s`` after it is written, for requests that arrive late.

Within one process, :meth:`SolverPool.single_flight` already joins identical
requests before they reach the database.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from service.errors import ProjectBusy
from service.store import SolveClaim, utcnow, write_gate
from service.times import as_utc

__all__ = ["solve_once", "CLAIM_TTL_S", "LINGER_S"]

CLAIM_TTL_S = 10.0  # a claim not refreshed for this long belongs to a dead process
LINGER_S = 15.0  # how long a written answer stays for late identical requests
_POLL_S = 0.05
_HEARTBEAT_S = 2.0


def _claim(factory: sessionmaker[Session], key: str, project: str, owner: str,
           share: tuple[int, int] | None) -> tuple[bool, str | None]:
    """Take the claim ``key`` (insert, or take over a lapsed one): (taken, a finished answer already there).

    Raises ProjectBusy when ``project`` already holds ``share[0]`` live claims (solves under way anywhere),
    telling the client to retry in ``share[1]`` seconds.
    """
    now = utcnow()
    with write_gate(factory), factory() as session:
        row = session.execute(
            select(SolveClaim.owner, SolveClaim.expires_at, SolveClaim.outcome).where(SolveClaim.key == key)
        ).first()
        if row is not None and as_utc(row.expires_at) > now:
            return False, row.outcome
        if share is not None:
            _check_share(session, project, *share, now=now)
        if row is None:
            session.add(SolveClaim(key=key, project=project, owner=owner, expires_at=now + timedelta(seconds=CLAIM_TTL_S)))
            try:
                session.commit()
            except IntegrityError:  # another process inserted it first
                session.rollback()
                return False, None
            return True, None
        # lapsed (its owner died, or an old answer): take it over, unless someone else just did
        taken = session.execute(
            update(SolveClaim).where(SolveClaim.key == key, SolveClaim.owner == row.owner)
            .values(owner=owner, project=project, expires_at=now + timedelta(seconds=CLAIM_TTL_S), outcome=None)
        ).rowcount == 1
        session.commit()
        return taken, None


def _check_share(session: Session, project: str, share: int, retry_after_s: int, *, now: datetime) -> None:
    live = session.execute(
        select(func.count()).select_from(SolveClaim)
        .where(SolveClaim.project == project, SolveClaim.outcome.is_(None), SolveClaim.expires_at > now)
    ).scalar_one()
    if live >= share:
        raise ProjectBusy(project, share, retry_after_s)


def _refresh(factory: sessionmaker[Session], key: str, owner: str) -> None:
    with write_gate(factory), factory() as session:
        session.execute(update(SolveClaim).where(SolveClaim.key == key, SolveClaim.owner == owner)
                        .values(expires_at=utcnow() + timedelta(seconds=CLAIM_TTL_S)))
        session.commit()


def _publish(factory: sessionmaker[Session], key: str, owner: str, outcome: str | None) -> None:
    """Write the answer for waiters (kept ``LINGER_S``), or drop the claim when there is none to share."""
    with write_gate(factory), factory() as session:
        mine = (SolveClaim.key == key) & (SolveClaim.owner == owner)
        if outcome is None:
            session.execute(delete(SolveClaim).where(mine))
        else:
            session.execute(update(SolveClaim).where(mine).values(
                outcome=outcome, expires_at=utcnow() + timedelta(seconds=LINGER_S)))
        # answers nobody can still be waiting for
        session.execute(delete(SolveClaim).where(SolveClaim.expires_at < utcnow() - timedelta(seconds=60)))
        session.commit()


def _state(factory: sessionmaker[Session], key: str) -> tuple[datetime | None, bool]:
    """The claim's expiry (None: gone) and whether its answer is written."""
    with factory() as session:
        row = session.execute(
            select(SolveClaim.expires_at, SolveClaim.outcome.is_not(None)).where(SolveClaim.key == key)
        ).first()
    return (None, False) if row is None else (as_utc(row[0]), bool(row[1]))


def _outcome(factory: sessionmaker[Session], key: str) -> str | None:
    with factory() as session:
        return session.execute(select(SolveClaim.outcome).where(SolveClaim.key == key)).scalar_one_or_none()


async def _wait(factory: sessionmaker[Session], key: str, give_up_at: float) -> str | None:
    """The answer another process writes under ``key``; None when its claim is gone or lapsed first."""
    while time.monotonic() < give_up_at:
        expires_at, done = await run_in_threadpool(_state, factory, key)
        if done:
            return await run_in_threadpool(_outcome, factory, key)
        if expires_at is None or expires_at <= utcnow():
            return None
        await asyncio.sleep(_POLL_S)
    return None


async def _heartbeat(factory: sessionmaker[Session], key: str, owner: str) -> None:
    while True:
        await asyncio.sleep(_HEARTBEAT_S)
        await run_in_threadpool(_refresh, factory, key, owner)


async def solve_once(factory: sessionmaker[Session], key: str, project: str,
                     solve: Callable[[], Awaitable[dict[str, Any]]], *, wait_s: float,
                     share: tuple[int, int] | None = None) -> tuple[dict[str, Any], bool]:
    """``solve()`` once for ``key`` across processes: (its answer, whether another process solved it).

    ``solve`` returns a JSON-able answer, shared with every identical request.
    An exception from ``solve`` (the solver queue full, ...) drops the claim so
    the next request tries again. A request that waited ``wait_s`` for another
    process's answer solves itself. With ``share`` (solves, Retry-After seconds), a
    project already holding that many live claims (its solves under way in any
    process or replica) gets ProjectBusy (429) instead of a new claim; joining an
    existing one is free.
    """
    owner = uuid.uuid4().hex
    give_up_at = time.monotonic() + wait_s
    while True:
        taken, ready = await run_in_threadpool(_claim, factory, key, project, owner, share)
        if ready is not None:
            return json.loads(ready), True
        if taken:
            break
        outcome = await _wait(factory, key, give_up_at)
        if outcome is not None:
            return json.loads(outcome), True
        if time.monotonic() >= give_up_at:
            return await solve(), False  # the owner is alive but slow beyond reason: do not wait forever
    beat = asyncio.ensure_future(_heartbeat(factory, key, owner))
    answer: dict[str, Any] | None = None
    try:
        answer = await solve()
        return answer, False
    finally:
        beat.cancel()
        text = json.dumps(answer, separators=(",", ":")) if answer is not None else None
        await run_in_threadpool(_publish, factory, key, owner, text)

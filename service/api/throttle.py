"""Throttling of failed authentication: per client address, a sliding window of failures, kept in the database.

Every failure is a row of ``auth_failures``, so ``--workers N`` processes and
replicas on one database count together: an address's ``failures``-th wrong key
in ``window_s`` throttles it everywhere. Each process decides on a request from
its own view of which addresses are throttled, read from the database at most
every ``sync_s`` seconds (a query per second, not per request: the fast path
answers cached reads in well under a millisecond) and updated at once by the
failures it records itself. So another process starts refusing within
``sync_s``, and a guesser spreading guesses over P processes gets at most
about P guesses past the limit (each process learns of the limit from the
database with its first failure past it) before every process refuses.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from service.store import AuthFailure, utcnow, write_gate
from service.times import as_utc

__all__ = ["AuthThrottle"]

log = logging.getLogger("service.throttle")

_ADDRESS_CHARS = 64  # the column's width; an IPv6 address with a zone fits


class AuthThrottle:
    """At most ``failures`` failed authentications per ``window_s`` seconds from one address, all processes together.

    Past that, every authenticated request from the address is refused (429)
    until enough of its failures leave the window, the right key included: a
    guesser must not learn that a guess was right.
    """

    def __init__(self, factory: sessionmaker[Session], failures: int, window_s: int, *, sync_s: float = 1.0,
                 clock: Callable[[], datetime] = utcnow):
        self.failures = failures
        self.window_s = window_s
        self.sync_s = sync_s
        self._factory = factory
        self._clock = clock
        self._window = timedelta(seconds=window_s)
        self._lock = threading.Lock()  # failed() runs in a thread, the checks on the event loop
        self._blocked: dict[str, datetime] = {}  # address -> when it may try again
        self._synced_at = float("-inf")

    def retry_after_s(self, address: str) -> int | None:
        """Seconds until ``address`` may try again; None when it is not throttled."""
        if time.monotonic() - self._synced_at >= self.sync_s:
            self._sync()
        until = self._blocked.get(_column(address))
        if until is None:
            return None
        left_s = (until - self._clock()).total_seconds()
        return max(1, int(left_s) + 1) if left_s > 0 else None

    def failed(self, address: str) -> None:
        """Count one failed authentication from ``address`` (a database write: call it off the event loop)."""
        address = _column(address)
        now = self._clock()
        cutoff = now - self._window
        with write_gate(self._factory), self._factory() as session:
            session.execute(delete(AuthFailure).where(AuthFailure.failed_at <= cutoff))  # keeps the table small
            session.add(AuthFailure(address=address, failed_at=now))
            session.flush()
            times = session.scalars(
                select(AuthFailure.failed_at)
                .where(AuthFailure.address == address, AuthFailure.failed_at > cutoff)
                .order_by(AuthFailure.failed_at)
            ).all()
            session.commit()
        until = self._until(times)
        if until is not None:
            with self._lock:
                self._blocked[address] = max(until, self._blocked.get(address, until))

    def _until(self, times: list[datetime]) -> datetime | None:
        """When fewer than ``failures`` of ``times`` (oldest first) will be left in the window; None if now."""
        if len(times) < self.failures:
            return None
        return as_utc(times[len(times) - self.failures]) + self._window

    def _sync(self) -> None:
        """Learn the addresses other processes throttled (a read; on failure the old view is kept)."""
        self._synced_at = time.monotonic()
        now = self._clock()
        cutoff = now - self._window
        over = (select(AuthFailure.address).where(AuthFailure.failed_at > cutoff)
                .group_by(AuthFailure.address).having(func.count() >= self.failures))
        try:
            with self._factory() as session:
                rows = session.execute(
                    select(AuthFailure.address, AuthFailure.failed_at)
                    .where(AuthFailure.failed_at > cutoff, AuthFailure.address.in_(over))
                    .order_by(AuthFailure.address, AuthFailure.failed_at)
                ).all()
        except SQLAlchemyError:
            log.warning("could not read the failed-authentication counts; keeping the last ones", exc_info=True)
            return
        by_address: dict[str, list[datetime]] = {}
        for address, failed_at in rows:
            by_address.setdefault(address, []).append(failed_at)
        with self._lock:
            blocked = {a: u for a, u in self._blocked.items() if u > now}
            for address, times in by_address.items():
                until = self._until(times)
                if until is not None:
                    blocked[address] = max(until, blocked.get(address, until))
            self._blocked = blocked


def _column(address: str) -> str:
    """``address`` as stored: at most the column's width, no NUL (which PostgreSQL cannot store)."""
    return address.replace("\x00", "?")[:_ADDRESS_CHARS]

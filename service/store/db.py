"""Engine, sessions and schema upgrades. Tables come only from the Alembic migrations."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from sqlalchemy import Engine, Select, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

try:
    import fcntl
except ImportError:  # not POSIX: SQLite's own busy handler alone
    fcntl = None

__all__ = [
    "make_engine", "make_sessionmaker", "session_scope", "insert_or_get", "upgrade", "Upgraded", "alembic_config",
    "redacted_url", "head_revision", "write_gate",
]

Row = TypeVar("Row")


def make_engine(url: str, *, sqlite_busy_timeout_ms: int = 10_000) -> Engine:
    """An engine for ``url``; SQLite gets WAL, a busy timeout and enforced foreign keys."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": sqlite_busy_timeout_ms / 1000},
        pool_size=8,
        max_overflow=32,
    )

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_conn, _record) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={int(sqlite_busy_timeout_ms)}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    return engine


@contextmanager
def write_gate(bind: Engine | sessionmaker[Session]) -> Iterator[None]:
    """Hold the write gate of a SQLite file for one write transaction (no-op on other databases).

    SQLite lets one writer at a time in and makes the others retry on a sleep
    schedule that grows to 100 ms, so under many concurrent writers a write
    waits several of those sleeps: the long tail of uploads under load. An
    exclusive ``flock`` on ``<database>-writegate`` held by every writer, in
    every thread and process, queues them instead and wakes the next at once.
    """
    path = _gate_path(bind.kw["bind"] if isinstance(bind, sessionmaker) else bind)
    if path is None or fcntl is None:
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _gate_path(engine: Engine) -> str | None:
    url = engine.url
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    return url.database + "-writegate"


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One session per request: commit on success, roll back on any error."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def insert_or_get(session: Session, row: Row, lookup: Select[tuple[Row]]) -> tuple[Row, bool]:
    """Insert ``row``; when a concurrent writer stored its unique key first, the row ``lookup`` finds instead.

    Returns the row and whether it is ``row``, inserted now. The insert runs in a
    savepoint, so losing the race leaves the session usable. Raises
    ``sqlalchemy.exc.NoResultFound`` when the insert failed but ``lookup`` finds
    nothing (another constraint failed: say a parent row deleted meanwhile).
    """
    _open_sqlite_transaction(session)
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:
        return session.execute(lookup).scalar_one(), False
    return row, True


def _open_sqlite_transaction(session: Session) -> None:
    """Make sure a SQLite session is inside a transaction before a savepoint.

    Python's sqlite3 module opens a transaction only before an INSERT, UPDATE or
    DELETE. A SAVEPOINT it runs outside one starts a transaction of its own, and
    its RELEASE commits it: each row went out alone, mid-session, so a reader
    saw some of a sweep's plans and solved the others again. BEGIN IMMEDIATE
    takes the write lock now (writers hold the write gate, so it is free).
    """
    connection = session.connection()
    if connection.dialect.name != "sqlite":
        return
    if not connection.connection.dbapi_connection.in_transaction:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def alembic_config(url: str):
    """Alembic config pointing at the packaged ``migrations`` directory."""
    from alembic.config import Config

    import migrations

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.attributes["url"] = url  # not via set_main_option: '%' in URLs breaks configparser
    return cfg


@dataclass(frozen=True)
class Upgraded:
    """What :func:`upgrade` did: the database (password hidden) and its revision before and after."""

    url: str
    from_revision: str | None  # None: a new (empty) database
    to_revision: str | None
    head: str | None  # the newest revision the migrations have


def head_revision() -> str | None:
    """The newest revision the migrations have (what :func:`upgrade` brings a database to)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def redacted_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, fit for a log or a terminal."""
    return make_url(url).render_as_string(hide_password=True)


def upgrade(url: str, revision: str = "head", *, engine: Engine | None = None) -> Upgraded:
    """Bring the database at ``url`` to ``revision`` (creating it if new); says from which revision to which."""
    from alembic import command
    from alembic.runtime.migration import MigrationContext

    cfg = alembic_config(url)
    owned = engine is None
    engine = engine or make_engine(url)
    try:
        with engine.begin() as conn:
            before = MigrationContext.configure(conn).get_current_revision()
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
            after = MigrationContext.configure(conn).get_current_revision()
    finally:
        if owned:
            engine.dispose()
    return Upgraded(redacted_url(url), before, after, head_revision())

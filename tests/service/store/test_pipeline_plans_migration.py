"""Migration 0005 adds the pipeline plans table to a database holding data, and takes it away again."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command
from pipeline_stats import pipeline_stage
from two_layer_stats import TWO_LAYER_STATS

import planner
from service.config import Settings
from service.store import alembic_config, make_engine, upgrade

TABLES_AT_0004 = ("stats", "stats_tags", "plans", "sweeps", "solve_claims", "auth_failures")


def _raw(url: str) -> dict:
    engine = make_engine(url)
    with engine.connect() as conn:
        out = {t: conn.execute(sa.text(f"SELECT * FROM {t} ORDER BY 1")).all() for t in TABLES_AT_0004}
        out["tables"] = sorted(sa.inspect(conn).get_table_names())
        out["revision"] = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one()
    engine.dispose()
    return out


def test_0005_keeps_every_row_and_pipeline_plans_work_after_it(empty_db_url, make_client, tmp_path):
    upgrade(empty_db_url, "0004")
    # What a service at 0004 stored: uploads (two of them a pipeline's stages), a plan, a sweep.
    client = make_client(Settings(data_dir=tmp_path, database_url=empty_db_url, api_keys={}))
    stats_id = client.post("/v1/stats", json=TWO_LAYER_STATS).json()["id"]
    stage_ids = [client.post("/v1/stats", json=pipeline_stage(s)).json()["id"] for s in (0, 1)]
    assert client.post("/v1/plans", json={"stats_id": stats_id, "memory_budget_gib": 0.001,
                                          "time_limit_s": 30}).status_code == 201
    assert client.post("/v1/sweeps", json={"stats_id": stats_id, "budgets_gib": [0.001, 0.002],
                                           "time_limit_s": 30}).status_code == 201
    before = _raw(empty_db_url)
    assert before["revision"] == "0004" and "pipeline_plans" not in before["tables"]
    assert all(before[t] for t in ("stats", "stats_tags", "plans", "sweeps"))

    assert upgrade(empty_db_url).from_revision == "0004"
    after = _raw(empty_db_url)
    assert {t: after[t] for t in TABLES_AT_0004} == {t: before[t] for t in TABLES_AT_0004}
    assert after["tables"] == sorted([*before["tables"], "pipeline_plans"])

    r = client.post("/v1/pipeline-plans", json={"stats_ids": stage_ids, "memory_budget_gib": 1900 / planner.GIB,
                                                "time_limit_s": 30})
    assert r.status_code == 201, r.text
    assert client.get(f"/v1/pipeline-plans/{r.json()['id']}").json()["stats_ids"] == stage_ids

    command.downgrade(alembic_config(empty_db_url), "0004")
    back = _raw(empty_db_url)
    assert back["tables"] == before["tables"] and back["revision"] == "0004"
    assert {t: back[t] for t in ("stats", "stats_tags", "sweeps")} == {t: before[t] for t in ("stats", "stats_tags",
                                                                                             "sweeps")}

"""Migration 0002 turns a database of sequential ids into opaque ones, every row and reference kept (both backends)."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from alembic import command
from two_layer_stats import TWO_LAYER_STATS

import planner
from service.solving import solve_job
from service.store import alembic_config, is_id, make_engine, plan_cache_key, upgrade

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
OPTIONS = planner.PlanOptions(time_limit_s=30).cache_fields()
BUDGETS = [4.5, 5.0]


def _tables(conn) -> dict[str, sa.Table]:
    meta = sa.MetaData()
    meta.reflect(conn)
    return meta.tables


def _fill_at_0001(url: str) -> None:
    """What the service stored before 0002: two projects' uploads, tags, plans and a sweep, under integer ids."""
    stats = planner.parse_stats(TWO_LAYER_STATS)
    document = stats.canonical_json()
    plans = solve_job(document, BUDGETS, OPTIONS)["plans"]  # real plans, as a solver process gives them
    engine = make_engine(url)
    with engine.begin() as conn:
        t = _tables(conn)
        for stats_id, project in [(1, "alpha"), (2, "beta")]:
            conn.execute(t["stats"].insert().values(
                id=stats_id, project=project, content_hash=planner.stats_hash(stats), model_name="two-layer-mlp",
                source_format="v1", module_count=len(stats.modules), op_count=8, baseline_peak_bytes=1,
                compute_ms=1.0, document=document, created_at=T0 + timedelta(seconds=stats_id)))
            conn.execute(t["stats_tags"].insert().values(stats_id=stats_id, key="owner", value=project))
        for plan_id, (stats_id, plan) in enumerate([(1, plans[0]), (1, plans[1]), (2, plans[0])], start=1):
            budget = plan["memory_budget_gib"]
            conn.execute(t["plans"].insert().values(
                id=plan_id, stats_id=stats_id, cache_key=plan_cache_key(planner.stats_hash(stats), budget, OPTIONS),
                planner_version=plan["planner_version"], request={**OPTIONS, "memory_budget_gib": budget},
                memory_budget_gib=budget, world_size=1, status=plan["status"], peak_bytes=plan["peak_bytes"],
                recompute_ms=plan["recompute_ms"], solve_seconds=0.5, result=json.dumps(plan),
                created_at=T0 + timedelta(seconds=10 + plan_id)))
        # A sweep's key: SHA-256 of its plan ids joined by commas (service/api/routes/sweeps.py, _record).
        key = hashlib.sha256(b"1,2").hexdigest()
        conn.execute(t["sweeps"].insert().values(id=1, stats_id=1, cache_key=key,
                                                 request={**OPTIONS, "budgets_gib": BUDGETS}, plan_ids=[1, 2],
                                                 created_at=T0 + timedelta(seconds=20)))
    engine.dispose()


def _snapshot(url: str) -> dict:
    """Everything stored, with ids replaced by what they name (project, budget), so two id schemes compare."""
    engine = make_engine(url)
    with engine.connect() as conn:
        t = _tables(conn)
        stats = {r.id: r for r in conn.execute(sa.select(t["stats"]))}
        plans = {r.id: r for r in conn.execute(sa.select(t["plans"]))}
        sweeps = list(conn.execute(sa.select(t["sweeps"])))
        tags = list(conn.execute(sa.select(t["stats_tags"])))
    engine.dispose()
    return {
        "stats": sorted((r.project, r.content_hash, r.document, r.created_at.replace(tzinfo=None))
                        for r in stats.values()),
        "tags": sorted((stats[r.stats_id].project, r.key, r.value) for r in tags),
        "plans": sorted((stats[r.stats_id].project, r.memory_budget_gib, r.cache_key, r.result) for r in plans.values()),
        "sweeps": [(stats[r.stats_id].project, [plans[p].memory_budget_gib for p in r.plan_ids]) for r in sweeps],
        "ids": [*stats, *plans, *(r.id for r in sweeps)],
    }


def test_upgrade_keeps_every_row_and_reference_and_the_service_serves_them(empty_db_url, make_client, tmp_path):
    from service.config import Settings

    upgrade(empty_db_url, "0001")
    _fill_at_0001(empty_db_url)
    before = _snapshot(empty_db_url)
    assert before["ids"] == [1, 2, 1, 2, 3, 1]
    assert upgrade(empty_db_url).from_revision == "0001"
    after = _snapshot(empty_db_url)
    assert {k: v for k, v in after.items() if k != "ids"} == {k: v for k, v in before.items() if k != "ids"}
    assert all(is_id(i) for i in after["ids"]) and len(set(after["ids"])) == len(after["ids"])

    # The service finds everything under the new ids, and the stored plans are still cache hits.
    client = make_client(Settings(data_dir=tmp_path, database_url=empty_db_url, api_keys={"ka": "alpha", "kb": "beta"}))
    alpha = {"Authorization": "Bearer ka"}
    [upload] = client.get("/v1/stats", headers=alpha).json()["items"]
    assert upload["tags"] == {"owner": "alpha"}
    listed = client.get(f"/v1/stats/{upload['id']}/plans", headers=alpha).json()["items"]
    assert [p["memory_budget_gib"] for p in listed] == BUDGETS
    again = client.post("/v1/plans", headers=alpha, json={"stats_id": upload["id"], "memory_budget_gib": 5.0,
                                                          "time_limit_s": 30})
    assert again.status_code == 200 and again.json()["cached"] is True and again.json()["id"] == listed[1]["id"]
    again = client.post("/v1/sweeps", headers=alpha, json={"stats_id": upload["id"], "budgets_gib": BUDGETS,
                                                           "time_limit_s": 30})
    assert again.status_code == 200, again.text
    assert [p["plan_id"] for p in again.json()["points"]] == [p["id"] for p in listed]
    sweep = client.get(f"/v1/sweeps/{again.json()['id']}", headers=alpha).json()
    assert [p["plan_id"] for p in sweep["points"]] == [p["id"] for p in listed]
    assert client.get(f"/v1/stats/{upload['id']}", headers={"Authorization": "Bearer kb"}).status_code == 404


def test_downgrade_gives_sequential_ids_back_without_losing_rows(empty_db_url):
    upgrade(empty_db_url, "0001")
    _fill_at_0001(empty_db_url)
    before = _raw(empty_db_url)
    upgrade(empty_db_url)
    command.downgrade(alembic_config(empty_db_url), "0001")
    assert _raw(empty_db_url) == before  # ids 1, 2, ... in creation order: the very rows they were
    engine = make_engine(empty_db_url)
    with engine.begin() as conn:  # new rows continue after the copied ids (PostgreSQL's serial counter)
        t = _tables(conn)
        new = conn.execute(t["stats"].insert().values(
            project="gamma", content_hash="c" * 64, model_name="m", source_format="v1", module_count=1, op_count=0,
            baseline_peak_bytes=1, compute_ms=1.0, document="{}", created_at=T0)).inserted_primary_key[0]
    engine.dispose()
    assert new == 3


def _raw(url: str) -> dict:
    engine = make_engine(url)
    with engine.connect() as conn:
        out = {t: conn.execute(sa.text(f"SELECT * FROM {t} ORDER BY 1")).all()
               for t in ("alembic_version", "stats", "stats_tags", "plans", "sweeps")}
    engine.dispose()
    return out


def test_an_inconsistent_database_is_refused_unchanged(tmp_path):
    url = f"sqlite:///{tmp_path / 'bad.db'}"
    upgrade(url, "0001")
    _fill_at_0001(url)
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE sweeps SET plan_ids = '[1, 99]'"))
    engine.dispose()
    before = _raw(url)
    with pytest.raises(RuntimeError, match=r"sweep 1 lists plan ids \[99\] that no plan has"):
        upgrade(url)
    assert _raw(url) == before and before["alembic_version"] == [("0001",)]

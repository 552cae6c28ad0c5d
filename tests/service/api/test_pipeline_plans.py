"""POST/GET /v1/pipeline-plans: every stage of a pipeline under one budget, each stage a cached plan (issue 30)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from pipeline_stats import pipeline_stage

import planner
from service.store import make_engine

# Stage 0 peaks at 2870 bytes without checkpointing and 1870 with its block checkpointed (pipeline_stats.py):
# 1900 bytes fits every stage only with a plan; 1000 bytes fits none.
FITS_GIB = 1900 / planner.GIB
TOO_SMALL_GIB = 1000 / planner.GIB


def _upload(client, doc) -> str:
    r = client.post("/v1/stats", json=doc)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _rows(settings) -> dict[str, int]:
    engine = make_engine(settings.sqlalchemy_url)
    with engine.connect() as conn:
        out = {t: conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one() for t in ("plans", "pipeline_plans")}
    engine.dispose()
    return out


def test_every_stage_planned_stored_and_cached(client, settings, assert_png):
    ids = [_upload(client, pipeline_stage(s)) for s in (0, 1)]
    body = {"stats_ids": [ids[1], ids[0]], "memory_budget_gib": FITS_GIB, "time_limit_s": 30}  # any order
    r = client.post("/v1/pipeline-plans", json=body)
    assert r.status_code == 201, r.text
    got = r.json()
    # The planner's own answer for the same documents (the CLI's JSON), plus the stored ids.
    want = planner.plan_pipeline([pipeline_stage(0), pipeline_stage(1)], FITS_GIB).model_dump(mode="json")
    assert got["stats_ids"] == ids and [p["stats_id"] for p in got["stages"]] == ids
    for name in ("status", "schedule", "stages_count", "microbatches", "in_flight", "stage_ms", "step_ms",
                 "bubble_ms", "slowest_stage", "infeasible_stage"):
        assert got[name] == want[name], name
    assert [p["peak_bytes"] for p in got["stages"]] == [p["peak_bytes"] for p in want["stages"]]
    assert got["stages"][0]["peak_bytes"] == 1870 and got["in_flight"] == [2, 1]  # pipeline_stats.py's figures
    assert got["cached"] is False and all(p["cached"] is False for p in got["stages"])
    assert _rows(settings) == {"plans": 2, "pipeline_plans": 1}

    # Each stage's plan is an ordinary stored plan: the same budget asked alone is a cache hit.
    alone = client.post("/v1/plans", json={"stats_id": ids[0], "memory_budget_gib": FITS_GIB, "time_limit_s": 30})
    assert alone.status_code == 200 and alone.json()["id"] == got["stages"][0]["id"]

    again = client.post("/v1/pipeline-plans", json=body)
    assert again.status_code == 200, again.text  # the same bundle, no solve: every stage from the cache
    assert again.json()["id"] == got["id"] and again.json()["cached"] is True
    assert _rows(settings) == {"plans": 2, "pipeline_plans": 1}
    read = client.get(f"/v1/pipeline-plans/{got['id']}")
    assert read.status_code == 200
    assert read.json() == {**again.json(), "created_at": read.json()["created_at"]}
    chart = client.get(got["chart_url"])
    assert chart.status_code == 200
    assert_png(chart.content)


def test_infeasible_names_the_stage_and_its_smallest_budget(client):
    ids = [_upload(client, pipeline_stage(s)) for s in (0, 1)]
    r = client.post("/v1/pipeline-plans", json={"stats_ids": ids, "memory_budget_gib": TOO_SMALL_GIB,
                                                "time_limit_s": 30})
    assert r.status_code == 201, r.text
    got = r.json()
    want = planner.plan_pipeline([pipeline_stage(0), pipeline_stage(1)], TOO_SMALL_GIB)
    assert got["status"] == "infeasible" and got["infeasible_stage"] == 0 and got["step_ms"] is None
    assert got["min_feasible_budget_gib"] == pytest.approx(want.min_feasible_budget_gib)
    assert client.get(got["chart_url"]).status_code == 200


def _refused(client, body: dict, code: int, field: list, value) -> None:
    r = client.post("/v1/pipeline-plans", json=body)
    assert r.status_code == code, r.text
    detail = r.json()
    assert detail["errors"][0]["loc"] == ["body", *map(str, field)], detail
    assert value is None or detail["errors"][0]["input"] == value, detail
    named = f"stats_ids[{field[1]}] {value}" if len(field) > 1 else "stats_ids"
    assert named in detail["detail"], detail


def test_stages_of_different_pipelines_missing_or_unknown_are_refused_storing_nothing(client, settings,
                                                                                        example_id):
    s0, s1 = _upload(client, pipeline_stage(0)), _upload(client, pipeline_stage(1))
    gpipe1 = _upload(client, pipeline_stage(1, schedule="gpipe"))
    of3 = _upload(client, pipeline_stage(1, stages=3))
    budget = {"memory_budget_gib": FITS_GIB, "time_limit_s": 30}
    _refused(client, {"stats_ids": [s0, gpipe1], **budget}, 422, ["stats_ids", 1], gpipe1)  # another schedule
    _refused(client, {"stats_ids": [s0, of3], **budget}, 422, ["stats_ids", 1], of3)  # another stage count
    _refused(client, {"stats_ids": [s1], **budget}, 422, ["stats_ids"], None)  # stage 0 missing
    _refused(client, {"stats_ids": [s0, s0], **budget}, 422, ["stats_ids", 1], s0)  # a stage twice
    _refused(client, {"stats_ids": [s0, example_id], **budget}, 422, ["stats_ids", 1], example_id)  # no pipeline
    missing = "00000000-0000-4000-8000-000000000000"
    r = client.post("/v1/pipeline-plans", json={"stats_ids": [s0, missing], **budget})
    assert r.status_code == 404 and f"stats_ids[1] {missing}" in r.json()["detail"], r.text
    r = client.post("/v1/pipeline-plans", json={"stats_ids": [], **budget})
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "stats_ids"], r.text
    r = client.post("/v1/pipeline-plans", json={"stats_ids": [s0, s1], "memory_budget_gib": -1})
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "memory_budget_gib"], r.text
    assert _rows(settings) == {"plans": 0, "pipeline_plans": 0}
    for path in ("/v1/pipeline-plans/77", f"/v1/pipeline-plans/{missing}", f"/v1/pipeline-plans/{missing}/chart.png"):
        assert client.get(path).status_code == 404, path


def test_a_deleted_stage_upload_takes_its_pipeline_plan_with_it(client):
    ids = [_upload(client, pipeline_stage(s)) for s in (0, 1)]
    r = client.post("/v1/pipeline-plans", json={"stats_ids": ids, "memory_budget_gib": FITS_GIB, "time_limit_s": 30})
    assert r.status_code == 201, r.text
    assert client.delete(f"/v1/stats/{ids[1]}").status_code == 204
    gone = client.get(f"/v1/pipeline-plans/{r.json()['id']}")
    assert gone.status_code == 404 and "deleted" in gone.json()["detail"]

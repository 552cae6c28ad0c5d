"""POST/GET /v1/sweeps: each point a cached plan; the curve as a chart."""

from __future__ import annotations

import pytest


def test_sweep_points_are_cached_plans(client, example_id, count_rows, assert_png):
    req = {"stats_id": example_id, "budgets_gib": [6.0, 4.5, 5.0, 0.5], "time_limit_s": 30}
    r = client.post("/v1/sweeps", json=req)
    assert r.status_code == 201, r.text
    sweep = r.json()
    assert [p["memory_budget_gib"] for p in sweep["points"]] == [0.5, 4.5, 5.0, 6.0]
    assert sweep["points"][0]["status"] == "infeasible"
    feasible = [p for p in sweep["points"] if p["status"] == "optimal"]
    assert len(feasible) == 3
    # More memory never needs more recomputation.
    rec = [p["recompute_ms"] for p in feasible]
    assert rec == sorted(rec, reverse=True)
    assert count_rows()["plans"] == 4

    # A single plan request at a sweep budget is a cache hit.
    one = client.post("/v1/plans", json={"stats_id": example_id, "memory_budget_gib": 5.0, "time_limit_s": 30})
    assert one.json()["cached"] is True
    assert one.json()["id"] == sweep["points"][2]["plan_id"]

    again_answer = client.post("/v1/sweeps", json=req)
    again = again_answer.json()
    assert again_answer.status_code == 200  # the same sweep, from the store
    assert again["cached"] is True and again["id"] == sweep["id"]
    assert client.get(f"/v1/sweeps/{sweep['id']}").json()["points"] == [
        {**p, "cached": True} for p in sweep["points"]]
    chart = client.get(sweep["chart_url"])
    assert chart.status_code == 200
    assert_png(chart.content)
    assert count_rows() == {"stats": 1, "stats_tags": 1, "plans": 4, "sweeps": 1}


def test_sweep_from_to_points(client, example_id):
    r = client.post("/v1/sweeps", json={"stats_id": example_id, "from_gib": 4.0, "to_gib": 6.0, "points": 5,
                                        "time_limit_s": 30})
    assert r.status_code == 201, r.text
    assert [p["memory_budget_gib"] for p in r.json()["points"]] == [4.0, 4.5, 5.0, 5.5, 6.0]


def test_bad_sweeps_are_422(client, example_id, count_rows):
    for body in ({"stats_id": example_id},
                 {"stats_id": example_id, "budgets_gib": [4.0], "from_gib": 1, "to_gib": 2, "points": 2},
                 {"stats_id": example_id, "from_gib": 6, "to_gib": 4, "points": 3},
                 {"stats_id": example_id, "budgets_gib": []},
                 {"stats_id": example_id, "budgets_gib": [1.0] * 65}):
        r = client.post("/v1/sweeps", json=body)
        assert r.status_code == 422, (body, r.text)
    assert client.get("/v1/sweeps/77").status_code == 404
    assert client.get("/v1/sweeps/77/chart.png").status_code == 404
    assert count_rows()["plans"] == 0


@pytest.mark.parametrize(
    ("extra", "loc", "sent"),
    [({"budgets_gib": [4.5, True]}, ["body", "budgets_gib", "1"], "true"),
     ({"budgets_gib": ["4.5"]}, ["body", "budgets_gib", "0"], '"4.5"'),
     ({"from_gib": True, "to_gib": 6, "points": 3}, ["body", "from_gib"], "true"),
     ({"from_gib": 4, "to_gib": "6", "points": 3}, ["body", "to_gib"], '"6"'),
     ({"from_gib": 4, "to_gib": 6, "points": "3"}, ["body", "points"], '"3"'),
     ({"from_gib": 4, "to_gib": 6, "points": 3.5}, ["body", "points"], "3.5"),
     ({"budgets_gib": [4.5], "world_size": "2"}, ["body", "world_size"], '"2"'),
     ({"budgets_gib": [4.5], "time_limit_s": True}, ["body", "time_limit_s"], "true"),
     ({"budgets_gib": [4.5], "mip_rel_gap": "0"}, ["body", "mip_rel_gap"], '"0"'),
     # Budgets of 0 named as sent: not the planner's budgets_gib[0] (sorted) or memory_budget_gib (one budget).
     ({"from_gib": 0, "to_gib": 6, "points": 3}, ["body", "from_gib"], "0"),
     ({"budgets_gib": [0]}, ["body", "budgets_gib", "0"], "0"),
     ({"budgets_gib": [4.5, 0.0]}, ["body", "budgets_gib", "1"], "0.0")],
)
def test_sweep_fields_named_as_sent_and_not_coerced(client, example_id, count_rows, extra, loc, sent):
    r = client.post("/v1/sweeps", json={"stats_id": example_id, **extra})
    assert r.status_code == 422, r.text
    body = r.json()
    assert [e["loc"] for e in body["errors"]] == [loc]
    assert f"{'.'.join(loc)}: " in body["detail"] and f"(got {sent})" in body["detail"]
    assert "memory_budget_gib" not in body["detail"]
    assert count_rows()["plans"] == 0


def test_sweep_stats_id_is_not_coerced(client, example_id):
    r = client.post("/v1/sweeps", json={"stats_id": [example_id], "budgets_gib": [4.5]})
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "stats_id"]

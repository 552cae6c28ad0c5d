"""Plans and sweeps with offload='on' through the HTTP API: what they state, the sweep's second curve, and the
refusals of bad offload options (422 naming the field and the value, nothing stored).

The stats: ``tests/data/mlp6_a100.json`` (six layers, collected for an A100-80GB, whose table link is 24 GB/s);
at 16 GB/s its plans offload and stall (tests/service/views/test_offload_charts.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

STATS = json.loads((Path(__file__).resolve().parents[2] / "data" / "mlp6_a100.json").read_text())
BUDGETS = [1.3, 1.5, 1.7]


@pytest.fixture
def mlp6_id(client) -> str:
    r = client.post("/v1/stats", json=STATS)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_plans_and_sweeps_state_their_offloading(client, mlp6_id, count_rows, assert_png):
    r = client.post("/v1/plans", json={"stats_id": mlp6_id, "memory_budget_gib": 1.5, "offload": "on",
                                       "host_link_gbps": 16, "time_limit_s": 60})
    assert r.status_code == 201, r.text
    plan = r.json()
    assert plan["status"] == "optimal" and plan["offload"] == "on" and plan["request"]["offload"] == "on"
    assert plan["host_link_gbps"] == {"d2h": 16.0, "h2d": 16.0}  # the option over the stats' 24 GB/s
    assert plan["host_bytes"] == sum(w["offloaded_bytes"] for w in plan["offload_windows"]) > 0
    assert plan["step_overhead_ms"] == pytest.approx(plan["recompute_ms"] + plan["offload_stall_ms"])
    assert plan["peak_bytes"] <= 1.5 * 2**30
    # The stats' own link (24 GB/s, the device table's) when the request gives none: another cache entry.
    table = client.post("/v1/plans", json={"stats_id": mlp6_id, "memory_budget_gib": 1.5, "offload": "on",
                                           "time_limit_s": 60}).json()
    assert table["host_link_gbps"] == {"d2h": 24.0, "h2d": 24.0} and table["id"] != plan["id"]

    body = {"stats_id": mlp6_id, "budgets_gib": BUDGETS, "offload": "on", "host_link_gbps": 16, "time_limit_s": 60}
    r = client.post("/v1/sweeps", json=body)
    assert r.status_code == 201, r.text
    points = r.json()["points"]
    assert all(p["status"] == "optimal" for p in points)
    assert points[1]["plan_id"] == plan["id"] and points[1]["cached"]  # 1.5 GiB: the plan above
    for p in points:
        assert p["step_overhead_ms"] == pytest.approx(p["recompute_ms"] + p["offload_stall_ms"])
    assert any(p["offload_stall_ms"] > 0 for p in points) and all(p["host_bytes"] > 0 for p in points)
    # two single plans, the sweep's other two budgets, and its three budgets without offloading
    assert count_rows()["plans"] == 2 + 2 + len(BUDGETS)
    chart = client.get(r.json()["chart_url"])
    assert chart.status_code == 200
    assert_png(chart.content)
    # The curve without offloading is in the plan cache: asking for it solves nothing.
    plain = client.post("/v1/sweeps", json={"stats_id": mlp6_id, "budgets_gib": BUDGETS, "time_limit_s": 60}).json()
    assert all(p["cached"] for p in plain["points"]) and "step_overhead_ms" not in plain["points"][0]
    # Offloading may only help: not offloading is one of its choices.
    for on, off in zip(points, plain["points"]):
        assert on["step_overhead_ms"] <= off["recompute_ms"] + 1e-6


BAD = [({"offload": "on", "host_link_gbps": 0}, "host_link_gbps", "0"),
       ({"offload": "on", "host_link_gbps": "fast"}, "host_link_gbps", "'fast'"),
       ({"offload": "maybe"}, "offload", "'maybe'"),
       ({"offload": "on", "host_budget_gib": 0}, "host_budget_gib", "0"),
       ({"offload": "on", "host_budget_gib": "lots"}, "host_budget_gib", "'lots'")]


def test_bad_offload_options_are_422_and_store_nothing(client, count_rows):
    from service.examples import EXAMPLE_STATS

    for path in ("/v1/plans", "/v1/sweeps"):
        budget = {"memory_budget_gib": 1.5} if path == "/v1/plans" else {"budgets_gib": BUDGETS}
        for extra, field, sent in BAD:
            r = client.post(path, json={"stats": STATS, **budget, **extra})
            assert r.status_code == 422, r.text
            errors = r.json()["errors"]
            assert [e["loc"] for e in errors] == [["body", field]], errors
            assert f"{field} must be" in errors[0]["msg"] and f"got {sent}" in errors[0]["msg"], errors
    assert count_rows() == {"stats": 0, "stats_tags": 0, "plans": 0, "sweeps": 0}
    # offload='on' for stats without a link figure (the docs' example without its A100 link) names the option;
    # the stats are stored as an upload (they are valid), no plan is
    doc = {**EXAMPLE_STATS, "metadata": {k: v for k, v in EXAMPLE_STATS["metadata"].items() if k != "host_link_gbps"}}
    r = client.post("/v1/plans", json={"stats": doc, "memory_budget_gib": 0.75, "offload": "on"})
    assert r.status_code == 422, r.text
    assert "host_link_gbps is needed with offload 'on': the stats carry no host link figure" in r.json()["detail"]
    assert r.json()["errors"][0]["loc"] == ["body", "host_link_gbps"]
    assert count_rows()["plans"] == 0 and count_rows()["stats"] == 1


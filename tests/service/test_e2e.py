"""End to end: a real ``sacplan serve`` on 127.0.0.1, restarted over the same data dir."""

from __future__ import annotations

import json
import signal

import httpx
import pytest
from live_server import REPO
from metrics_text import sample

from service.store import head_revision

SHARED_L4 = REPO.parent / "shared" / "reference" / "torch_format_transformer_L4.json"
L4_PATH = REPO / "tests" / "data" / "torch_format_transformer_L4.json"

pytestmark = pytest.mark.slow


def test_serve_upload_plan_cache_chart_restart(server, assert_png):
    server.start()
    assert f"docs: {server.url}/docs" in server.log.read_text()  # where a new user goes first
    doc = json.loads((SHARED_L4 if SHARED_L4.exists() else L4_PATH).read_text())
    with httpx.Client(base_url=server.url, timeout=120) as c:
        assert c.get("/", follow_redirects=True).url.path == "/docs"  # / leads to the docs
        up = c.post("/v1/stats", json=doc)
        assert up.status_code == 201, up.text
        stats_id = up.json()["id"]

        plans = {}
        for budget in (4.0, 5.0, 6.0):
            r = c.post("/v1/plans", json={"stats_id": stats_id, "memory_budget_gib": budget, "time_limit_s": 60})
            assert r.status_code == 201, r.text
            assert r.json()["cached"] is False
            assert r.json()["status"] in ("optimal", "feasible"), r.json()["message"]
            assert r.json()["peak_bytes"] <= budget * 2**30
            plans[budget] = r.json()
        solves = sample(c.get("/metrics").text, "sacplan_solves_started_total")
        assert solves == 3

        again = c.post("/v1/plans", json={"stats_id": stats_id, "memory_budget_gib": 5.0, "time_limit_s": 60})
        assert again.json()["cached"] is True and again.json()["id"] == plans[5.0]["id"]
        assert sample(c.get("/metrics").text, "sacplan_solves_started_total") == solves
        assert c.get(f"/v1/stats/{stats_id}/plans").json()["total"] == 3

        chart = c.get(f"/v1/plans/{plans[4.0]['id']}/chart.png")
        assert chart.status_code == 200 and chart.headers["content-type"] == "image/png"
        assert_png(chart.content)

    assert (server.data_dir / "sacplan.db").exists()
    server.stop()
    server.start()
    with httpx.Client(base_url=server.url, timeout=120) as c:
        assert c.get(f"/v1/stats/{stats_id}").json()["content_hash"] == up.json()["content_hash"]
        assert c.post("/v1/stats", json=doc).status_code == 200  # known after the restart
        r = c.post("/v1/plans", json={"stats_id": stats_id, "memory_budget_gib": 6.0, "time_limit_s": 60})
        assert r.json()["cached"] is True and r.json()["id"] == plans[6.0]["id"]
        assert sample(c.get("/metrics").text, "sacplan_solves_started_total") == 0  # a fresh server solved nothing
        assert c.get(f"/v1/plans/{plans[4.0]['id']}").json()["recompute_ms"] == plans[4.0]["recompute_ms"]
    # One line of ours says what became of the database at each start; no library chatter.
    log = server.log.read_text()
    assert f"upgraded from an empty database to revision {head_revision()} (head)" in log
    assert f"already at head (revision {head_revision()})" in log
    assert "alembic" not in log.lower(), log[:3000]


@pytest.mark.parametrize(("sig", "group"), [(signal.SIGINT, True), (signal.SIGTERM, False), (signal.SIGTERM, True)],
                         ids=["ctrl-c", "sigterm", "sigterm-to-group"])
def test_stale_stats_and_stopping_leave_a_clean_log(server, example_doc, store_as_older_planner, sig, group):
    """A 409 on one keep-alive connection, no exception reaching uvicorn; stopping releases the solver pool."""
    server.start()
    url = f"sqlite:///{server.data_dir / 'sacplan.db'}"
    stale = store_as_older_planner(url, lambda doc: doc["modules"][2].update(parent="Net"))
    with httpx.Client(base_url=server.url, timeout=120) as c:
        good = c.post("/v1/stats", json=example_doc).json()["id"]
        assert c.post("/v1/plans", json={"stats_id": good, "memory_budget_gib": 4.5}).status_code == 201
        answers = [c.get(f"/v1/stats/{stale}"), c.post("/v1/plans", json={"stats_id": stale, "memory_budget_gib": 4.5}),
                   c.post("/v1/sweeps", json={"stats_id": stale, "budgets_gib": [4.0, 5.0]})]
        assert [r.status_code for r in answers] == [409, 409, 409], [r.text for r in answers]
        assert c.get("/v1/stats").json()["total"] == 2  # the same connection, still open
    server.stop(sig, group=group)
    assert server.proc.returncode in (0, -sig), server.proc.returncode
    server.wait_group_gone()  # multiprocessing's resource tracker writes its leak warning as it exits
    log = server.log.read_text()
    assert "Exception in ASGI application" not in log and "Traceback" not in log, log[-3000:]
    assert "leaked semaphore" not in log, log[-3000:]
    assert "Application shutdown complete" in log


def test_serve_plans_with_offloading(server, assert_png):
    """A real server plans with offload='on' (six layers for an A100-80GB, at 16 GB/s: it offloads and stalls),
    draws the plan's chart in its render process, and refuses a bad link figure, storing nothing."""
    server.start()
    doc = json.loads((REPO / "tests" / "data" / "mlp6_a100.json").read_text())
    with httpx.Client(base_url=server.url, timeout=120) as c:
        stats_id = c.post("/v1/stats", json=doc).json()["id"]
        ask = {"stats_id": stats_id, "memory_budget_gib": 1.5, "offload": "on", "time_limit_s": 60}
        r = c.post("/v1/plans", json={**ask, "host_link_gbps": 16})
        assert r.status_code == 201, r.text
        plan = r.json()
        assert plan["status"] == "optimal" and plan["host_bytes"] > 0 and plan["offload_stall_ms"] > 0
        assert plan["peak_bytes"] <= 1.5 * 2**30
        assert any(m.get("offload") and 1 in m["offload"] for m in plan["modules"])
        chart = c.get(f"/v1/plans/{plan['id']}/chart.png")
        assert chart.status_code == 200 and chart.headers["content-type"] == "image/png"
        assert_png(chart.content)
        bad = c.post("/v1/plans", json={**ask, "host_link_gbps": -1})
        assert bad.status_code == 422 and bad.json()["errors"][0]["loc"] == ["body", "host_link_gbps"]
        assert "host_link_gbps must be a positive number of GB/s" in bad.json()["detail"]
        assert bad.json()["errors"][0]["input"] == -1
        assert c.get(f"/v1/stats/{stats_id}/plans").json()["total"] == 1

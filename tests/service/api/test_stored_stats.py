"""Stats stored by an older planner that today's validation rejects: a 409 that says what to do, never a 500."""

from __future__ import annotations

import pytest

from planner import PLANNER_VERSION

LEAF = "Net.layers.0.fc"


def _module(doc: dict, fqn: str) -> dict:
    return next(m for m in doc["modules"] if m["fqn"] == fqn)


def _ops_on_leaf(doc: dict) -> None:
    # Allowed before commit 7033980: op lists on a leaf module.
    _module(doc, LEAF)["ops"] = _module(doc, "Net.layers.0")["ops"]


def _parent_skips_a_level(doc: dict) -> None:
    # Allowed before commit 7033980: a parent that is not the innermost enclosing module.
    _module(doc, LEAF)["parent"] = "Net"


CASES = [
    pytest.param(_ops_on_leaf, "modules[2].ops: 'Net.layers.0.fc' is a leaf module", id="ops-on-leaf"),
    pytest.param(_parent_skips_a_level, "modules[2].parent 'Net' is not the innermost", id="parent-skips-a-level"),
]


def _check_409(r, stats_id: str, reason: str) -> None:
    assert r.status_code == 409, r.text
    body = r.json()
    detail = body["detail"]
    assert f"stats_id {stats_id} " in detail and PLANNER_VERSION in detail
    assert reason in detail  # the field and the value, in the planner's words
    assert "POST /v1/stats" in detail and f"DELETE /v1/stats/{stats_id}" in detail  # what to do
    assert body["errors"] and set(body["errors"][0]) == {"loc", "msg", "input"}
    assert not body["errors"][0]["msg"].startswith("Value error")


@pytest.mark.parametrize(("corrupt", "reason"), CASES)
def test_stats_failing_todays_validation_are_409_on_every_route(
        client, settings, example_id, store_as_older_planner, count_rows, corrupt, reason):
    # The example's modules[2] is Net.layers.0.fc (service/examples.py); a plan stored before the upgrade.
    old_plan = client.post("/v1/plans", json={"stats_id": example_id, "memory_budget_gib": 4.5}).json()
    stale = store_as_older_planner(settings.sqlalchemy_url, corrupt, stats_id=example_id)
    assert stale == example_id

    _check_409(client.get(f"/v1/stats/{stale}"), stale, reason)
    _check_409(client.post("/v1/plans", json={"stats_id": stale, "memory_budget_gib": 5.0}), stale, reason)
    _check_409(client.post("/v1/sweeps", json={"stats_id": stale, "budgets_gib": [4.0, 6.0]}), stale, reason)
    _check_409(client.get(f"/v1/plans/{old_plan['id']}/chart.png"), stale, reason)
    assert count_rows()["plans"] == 1  # nothing solved or stored for it

    # What does not parse the document keeps working, so the upload can be found and removed.
    listing = client.get("/v1/stats")
    assert listing.status_code == 200 and [s["id"] for s in listing.json()["items"]] == [stale]
    assert client.get(f"/v1/stats/{stale}/plans").json()["total"] == 1
    assert client.get(f"/v1/plans/{old_plan['id']}").json()["status"] == "optimal"  # served as stored
    assert client.delete(f"/v1/stats/{stale}").status_code == 204
    assert count_rows() == {"stats": 0, "stats_tags": 0, "plans": 0, "sweeps": 0}


def test_the_solver_pool_survives_stale_stats(client, settings, example_doc, store_as_older_planner):
    stale = store_as_older_planner(settings.sqlalchemy_url, _ops_on_leaf)
    for _ in range(2):  # the worker's parse cache does not keep the failure, nor does it break the pool
        assert client.post("/v1/plans", json={"stats_id": stale, "memory_budget_gib": 4.5}).status_code == 409
    good = client.post("/v1/stats", json=example_doc).json()["id"]
    r = client.post("/v1/plans", json={"stats_id": good, "memory_budget_gib": 4.5})
    assert r.status_code == 201 and r.json()["status"] == "optimal", r.text

"""API keys: 401 without a valid key; each project sees only its own stats and plans."""

from __future__ import annotations

import logging

import pytest

KEY_A = "key-a-0123456789abcdef"
KEY_B = "key-b-fedcba9876543210"


@pytest.fixture
def auth_client(make_client, settings):
    return make_client(settings.model_copy(update={"api_keys": {KEY_A: "alpha", KEY_B: "beta"}}))


def _as(key):
    return {"Authorization": f"Bearer {key}"}


def test_v1_needs_a_valid_key(auth_client, example_doc, count_rows):
    assert auth_client.get("/v1/stats").status_code == 401
    assert auth_client.get("/v1/stats", headers=_as("wrong")).status_code == 401
    assert auth_client.get("/v1/stats", headers={"Authorization": KEY_A}).status_code == 401
    r = auth_client.post("/v1/stats", json=example_doc)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert count_rows()["stats"] == 0
    assert auth_client.get("/healthz").status_code == 200  # probes need no key
    assert auth_client.get("/v1/stats", headers=_as(KEY_A)).status_code == 200


def test_projects_are_isolated(auth_client, example_doc, count_rows):
    a = auth_client.post("/v1/stats", json=example_doc, headers=_as(KEY_A))
    assert a.status_code == 201
    # The same document in another project is a separate upload.
    b = auth_client.post("/v1/stats", json=example_doc, headers=_as(KEY_B))
    assert b.status_code == 201 and b.json()["id"] != a.json()["id"]
    a_id = a.json()["id"]

    plan = auth_client.post("/v1/plans", json={"stats_id": a_id, "memory_budget_gib": 5.0, "time_limit_s": 30},
                            headers=_as(KEY_A))
    assert plan.status_code == 201, plan.text
    plan_id = plan.json()["id"]

    for path in (f"/v1/stats/{a_id}", f"/v1/stats/{a_id}/plans", f"/v1/plans/{plan_id}",
                 f"/v1/plans/{plan_id}/chart.png"):
        assert auth_client.get(path, headers=_as(KEY_B)).status_code == 404, path
        assert auth_client.get(path, headers=_as(KEY_A)).status_code == 200, path
    assert auth_client.post("/v1/plans", json={"stats_id": a_id, "memory_budget_gib": 5.0},
                            headers=_as(KEY_B)).status_code == 404
    assert auth_client.delete(f"/v1/stats/{a_id}", headers=_as(KEY_B)).status_code == 404
    assert [s["id"] for s in auth_client.get("/v1/stats", headers=_as(KEY_B)).json()["items"]] == [b.json()["id"]]
    assert count_rows()["stats"] == 2 and count_rows()["plans"] == 1


def test_keys_never_reach_the_logs_or_reprs(auth_client, settings, caplog):
    caplog.set_level(logging.DEBUG)
    auth_client.get("/v1/stats", headers=_as(KEY_A))
    auth_client.get("/v1/stats", headers=_as(KEY_A[:-1] + "x"))
    assert KEY_A not in caplog.text and KEY_A[:-1] not in caplog.text
    keyed = settings.model_copy(update={"api_keys": {KEY_A: "alpha"}})
    assert KEY_A not in repr(keyed) and KEY_A not in str(keyed)

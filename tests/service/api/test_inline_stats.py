"""Plans and sweeps with the stats inline (``stats`` instead of ``stats_id``): stored as an upload would be."""

from __future__ import annotations

import json

import pytest

ROUTES = {"/v1/plans": {"memory_budget_gib": 4.5, "time_limit_s": 30},
          "/v1/sweeps": {"budgets_gib": [4.5, 5.0], "time_limit_s": 30}}


@pytest.mark.parametrize("route", ROUTES)
def test_inline_stats_are_an_upload(client, example_doc, count_rows, route):
    first = client.post(route, json={"stats": example_doc, **ROUTES[route]})
    assert first.status_code == 201, first.text
    stats_id = first.json()["stats_id"]
    upload = client.post("/v1/stats", json=example_doc)  # the same document: the same upload
    assert upload.status_code == 200 and upload.json()["id"] == stats_id
    assert client.get(f"/v1/stats/{stats_id}").json()["content_hash"] == upload.json()["content_hash"]
    again = client.post(route, json={"stats": example_doc, **ROUTES[route]})
    assert again.status_code == 200 and again.json()["cached"] is True and again.json()["stats_id"] == stats_id
    by_id = client.post(route, json={"stats_id": stats_id, **ROUTES[route]})
    assert by_id.status_code == 200 and by_id.json()["id"] == first.json()["id"]
    assert count_rows()["stats"] == 1


def test_inline_stats_find_an_earlier_upload(client, example_id, example_doc, count_rows):
    doc = json.loads(json.dumps(example_doc, sort_keys=True))  # another key order: the same content
    r = client.post("/v1/plans", json={"memory_budget_gib": 5.0, "stats": doc, "time_limit_s": 30})
    assert r.status_code == 201 and r.json()["stats_id"] == example_id
    assert count_rows()["stats"] == 1


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(("given", "message"), [
    ("both", "give stats_id or stats, not both"),
    ("neither", "give stats_id (the id of a stats upload) or stats (the stats document itself)")])
def test_exactly_one_of_stats_id_and_stats(client, example_id, example_doc, count_rows, route, given, message):
    source = {"both": {"stats_id": example_id, "stats": example_doc}, "neither": {}}[given]
    r = client.post(route, json={**source, **ROUTES[route]})
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith(f"body: {message}")
    assert [(e["loc"], e["msg"]) for e in r.json()["errors"]] == [(["body"], message)]
    assert count_rows()["plans"] == 0 and count_rows()["sweeps"] == 0


@pytest.mark.parametrize("route", ROUTES)
def test_invalid_inline_stats_are_422_naming_the_field(client, example_doc, count_rows, route):
    example_doc["modules"][1]["ops"][0]["runtime_ms"] = -1.0
    r = client.post(route, json={"stats": example_doc, **ROUTES[route]})
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith("invalid stats (body.stats): modules[1].ops[0].runtime_ms")
    assert r.json()["errors"][0]["loc"] == ["body", "stats", "modules", "1", "ops", "0", "runtime_ms"]
    assert set(r.json()["errors"][0]) == {"loc", "msg", "input"}
    assert count_rows() == {"stats": 0, "stats_tags": 0, "plans": 0, "sweeps": 0}


@pytest.mark.parametrize("route", ROUTES)
def test_inline_stats_over_the_body_limit_are_413(make_client, settings, example_doc, count_rows, route):
    client = make_client(settings.model_copy(update={"max_body_bytes": 1024}))
    r = client.post(route, json={"stats": example_doc, **ROUTES[route]})
    assert r.status_code == 413
    assert count_rows()["stats"] == 0

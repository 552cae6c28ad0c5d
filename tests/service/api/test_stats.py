"""POST/GET/DELETE /v1/stats, and everything a client might send that is not stats."""

from __future__ import annotations

import json

import pytest

import planner
from service.store import is_id
from planner import baseline_peak_bytes, compute_ms


def test_upload_v1_then_same_document_returns_same_id(client, example_doc, count_rows):
    first = client.post("/v1/stats", json=example_doc)
    assert first.status_code == 201
    body = first.json()
    stats = planner.parse_stats(example_doc)
    assert body["content_hash"] == planner.stats_hash(stats)
    assert body["model_name"] == "two-layer-mlp"
    assert body["module_count"] == 5 and body["op_count"] == 8
    assert body["baseline_peak_bytes"] == baseline_peak_bytes(stats)
    assert body["compute_ms"] == pytest.approx(compute_ms(stats))
    assert body["tags"] == {"team": "demo"}

    # Same content, different key order and whitespace: same identity.
    again = client.post("/v1/stats", content=json.dumps(example_doc, indent=2, sort_keys=True),
                        headers={"content-type": "application/json"})
    assert again.status_code == 200
    assert again.json()["id"] == body["id"]
    assert count_rows()["stats"] == 1


def test_upload_torch_format(client, l4_doc):
    r = client.post("/v1/stats", json=l4_doc)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["source_format"] == "torch"
    assert body["model_name"] == "dtensor_transformer_L4"
    assert body["module_count"] == len(l4_doc["module_info"]["mod_stats"])


def test_read_has_module_tree(client, example_id):
    r = client.get(f"/v1/stats/{example_id}")
    assert r.status_code == 200
    tree = r.json()["module_tree"]
    assert tree["fqn"] == "Net"
    assert [c["fqn"] for c in tree["children"]] == ["Net.layers.0", "Net.layers.1"]
    assert tree["children"][0]["op_count"] == 4
    assert tree["children"][0]["children"][0] == {
        "fqn": "Net.layers.0.fc", "is_leaf": True, "op_count": None, "act_saved_bytes": 512 * 2**20,
        "fw_ms": 3.0, "bw_ms": 6.0, "children": [],
    }


def test_list_filters_and_pages(client, example_doc, l4_doc):
    ids = []
    for i in range(3):
        doc = json.loads(json.dumps(example_doc))
        doc["metadata"]["tags"] = {"team": "a" if i < 2 else "b", "run": str(i)}
        ids.append(client.post("/v1/stats", json=doc).json()["id"])
    client.post("/v1/stats", json=l4_doc)

    everything = client.get("/v1/stats").json()
    assert everything["total"] == 4
    by_name = client.get("/v1/stats", params={"model_name": "two-layer-mlp"}).json()
    assert [s["id"] for s in by_name["items"]] == ids[::-1]  # newest first
    team_a = client.get("/v1/stats", params={"tag": "team=a"}).json()
    assert [s["id"] for s in team_a["items"]] == ids[1::-1]
    has_run = client.get("/v1/stats", params={"tag": "run"}).json()
    assert has_run["total"] == 3
    page = client.get("/v1/stats", params={"limit": 2, "offset": 1}).json()
    assert page["total"] == 4 and len(page["items"]) == 2
    assert [s["id"] for s in page["items"]] == [s["id"] for s in everything["items"]][1:3]


def test_delete_then_404(client, example_id, count_rows):
    assert count_rows()["stats_tags"] == 1
    assert client.delete(f"/v1/stats/{example_id}").status_code == 204
    assert client.get(f"/v1/stats/{example_id}").status_code == 404
    assert client.delete(f"/v1/stats/{example_id}").status_code == 404
    assert count_rows() == {"stats": 0, "stats_tags": 0, "plans": 0, "sweeps": 0}


# fixed ids (never random): parallel workers must collect the same test names
@pytest.mark.parametrize("unknown", ["5a54d12b-9325-4a88-bd11-8c0733d5c39b", "12345", "123456789012345678901234567890", "abc"])
def test_unknown_and_malformed_ids_are_404_alike(client, example_id, unknown):
    expected = {"detail": f"stats_id {unknown} does not exist"}
    for method, path in [("GET", f"/v1/stats/{unknown}"), ("GET", f"/v1/stats/{unknown}/plans"),
                         ("DELETE", f"/v1/stats/{unknown}")]:
        r = client.request(method, path)
        assert (r.status_code, r.json()) == (404, expected), (method, path)
    assert client.get(f"/v1/stats/{example_id}").status_code == 200


def test_ids_are_opaque(client, example_doc):
    # Ids follow no sequence: a second upload's id says nothing about how many came before.
    other = json.loads(json.dumps(example_doc))
    other["metadata"]["model_name"] = "other"
    ids = [client.post("/v1/stats", json=d).json()["id"] for d in (example_doc, other)]
    assert all(is_id(i) for i in ids) and len(set(ids)) == 2


def test_invalid_stats_names_field_and_stores_nothing(client, example_doc, count_rows):
    before = count_rows()
    doc = json.loads(json.dumps(example_doc))
    doc["modules"][1]["ops"][0]["runtime_ms"] = -1.0
    r = client.post("/v1/stats", json=doc)
    assert r.status_code == 422
    assert "modules[1].ops[0].runtime_ms" in r.json()["detail"]
    assert "-1" in r.json()["detail"]
    assert r.json()["errors"][0]["loc"] == ["modules", "1", "ops", "0", "runtime_ms"]

    doc = json.loads(json.dumps(example_doc))
    doc["modules"][2]["parent"] = "Net.nowhere"
    r = client.post("/v1/stats", json=doc)
    assert r.status_code == 422
    assert "Net.nowhere" in r.json()["detail"]
    assert count_rows() == before


BAD_BODIES = [
    pytest.param(b'{"format": "sacplan.stats/v1", "metadata":', "application/json", id="truncated-json"),
    pytest.param(b"not json at all", "application/json", id="garbage"),
    pytest.param(b"[1, 2, 3]", "application/json", id="array"),
    pytest.param(b'"a string"', "application/json", id="string"),
    pytest.param(b"", "application/json", id="empty"),
    pytest.param(b'{"a": 1}', "text/plain", id="wrong-content-type"),
    pytest.param(b'{"a": 1}', "application/x-www-form-urlencoded", id="form"),
    pytest.param(b"\xff\xfe\x00garbage", "application/json", id="not-utf8"),
    pytest.param(b"[" * 100_000 + b"]" * 100_000, "application/json", id="deeply-nested"),
    pytest.param(b'{"modules": NaN}', "application/json", id="nan"),
    pytest.param(b"{" + b'"x": 1' + b"}", "application/json", id="unknown-shape"),
]


@pytest.mark.parametrize(("body", "content_type"), BAD_BODIES)
def test_bad_bodies_are_4xx_and_store_nothing(client, count_rows, body, content_type):
    r = client.post("/v1/stats", content=body, headers={"content-type": content_type})
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    assert "detail" in r.json()
    assert count_rows()["stats"] == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [("runtime_ms", float("nan")), ("runtime_ms", float("inf")), ("output_bytes", 10**400),
     ("output_bytes", 2**63), ("output_bytes", 1e300), ("runtime_ms", "fast")],
)
def test_bad_numbers_are_422(client, example_doc, count_rows, field, value):
    example_doc["modules"][1]["ops"][0][field] = value
    # json.dumps writes NaN/Infinity literals, which Python's parser (and so FastAPI's) accepts.
    r = client.post("/v1/stats", content=json.dumps(example_doc), headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text[:300]
    assert "modules[1].ops[0]" in r.json()["detail"]
    assert count_rows()["stats"] == 0


def test_body_over_limit_is_413(make_client, settings, example_doc, count_rows):
    small = settings.model_copy(update={"max_body_bytes": 1024})
    client = make_client(small)
    body = json.dumps(example_doc).encode()
    assert len(body) > 1024
    r = client.post("/v1/stats", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 413

    def chunks():  # no Content-Length: the limit is counted as the body streams in
        for i in range(0, len(body), 1000):
            yield body[i:i + 1000]

    r = client.post("/v1/stats", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert count_rows()["stats"] == 0
    assert client.get("/healthz").status_code == 200


def test_swagger_examples_work_end_to_end(client):
    """The bodies Swagger UI's "Try it out" sends are valid and plan the example at its budget."""
    spec = client.get("/openapi.json").json()
    assert client.get("/docs").status_code == 200
    assert "three steps" in spec["info"]["description"].lower()
    upload = spec["paths"]["/v1/stats"]["post"]["requestBody"]["content"]["application/json"]
    stats_example = upload["examples"]["two_layers_v1"]["value"]
    plan_schema = spec["components"]["schemas"]["PlanRequest"]
    plan_example = plan_schema["examples"][0]

    r = client.post("/v1/stats", json=stats_example)
    assert r.status_code == 201 and plan_example["stats"] == stats_example  # the plan example carries them inline
    assert stats_example["fw_pre_order"].count("Net.layers.1") == 1  # two layers
    plan = client.post("/v1/plans", json=plan_example)
    assert plan.status_code == 201 and plan.json()["status"] == "optimal", plan.text
    assert plan.json()["stats_id"] == r.json()["id"]
    sweep = client.post("/v1/sweeps", json=spec["components"]["schemas"]["SweepRequest"]["examples"][0])
    assert sweep.status_code == 201, sweep.text
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            assert op.get("tags"), (method, path)
            assert "200" in op["responses"] or "201" in op["responses"] or "204" in op["responses"], (method, path)


@pytest.mark.parametrize("tag", ["", "=", "=demo"])
def test_tag_filter_without_a_key_is_422(client, example_id, tag):
    r = client.get("/v1/stats", params={"tag": tag})
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith(f"tag {tag!r} names no key")
    assert r.json()["errors"] == [{"loc": ["query", "tag"], "msg": r.json()["detail"], "input": tag}]


def test_tag_filter_is_key_or_key_value(client, example_id):
    # 'key' alone is the documented filter "has that tag" (the Query's description), not a malformed one.
    assert client.get("/v1/stats", params={"tag": "team"}).json()["total"] == 1
    assert client.get("/v1/stats", params={"tag": "team=demo"}).json()["total"] == 1
    assert client.get("/v1/stats", params={"tag": "bad"}).json()["total"] == 0
    assert client.get("/v1/stats", params={"tag": "team=a=b"}).json()["total"] == 0  # value 'a=b'

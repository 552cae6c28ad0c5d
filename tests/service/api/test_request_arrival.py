"""Plan and sweep requests: the time limit counts from the request's arrival, large inline stats are read off the
event loop (in a render process, as uploads are) with the answers the small path gives, time limits no solve can
use are refused, and bodies are UTF-8 JSON only (issue 33)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx
import pytest

from service.examples import EXAMPLE_STATS
from service.main import create_app
from service.transport import LARGE_BODY_BYTES, MIN_TIME_LIMIT_S

from conftest import L4_PATH

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from synthetic import make_layers  # noqa: E402

JSON = {"content-type": "application/json"}
PAD = b" " * LARGE_BODY_BYTES  # JSON allows whitespace: the same request, past the size read in-process


@pytest.fixture(scope="module")
def big_doc() -> dict:
    return make_layers(json.loads(L4_PATH.read_text()), 60)  # ~1.2 MiB


def test_a_large_inline_plan_stores_the_stats_as_an_upload_would(client, big_doc, count_rows):
    request = {"stats": big_doc, "memory_budget_gib": 1000, "time_limit_s": 30}
    r = client.post("/v1/plans", content=json.dumps(request).encode(), headers=JSON)
    assert r.status_code == 201, r.text[:500]
    upload = client.post("/v1/stats", content=json.dumps(big_doc).encode(), headers=JSON)
    assert upload.status_code == 200 and upload.json()["id"] == r.json()["stats_id"]  # the same upload
    assert r.json()["request"]["time_limit_s"] == 30.0
    sweep = client.post("/v1/sweeps", content=json.dumps({"stats": big_doc, "budgets_gib": [1000], "time_limit_s": 30}),
                        headers=JSON)
    assert sweep.status_code == 201 and sweep.json()["stats_id"] == r.json()["stats_id"], sweep.text[:500]
    assert count_rows()["stats"] == 1


@pytest.mark.parametrize("request_body", [
    {"stats": EXAMPLE_STATS},  # no budget
    {"stats": EXAMPLE_STATS, "stats_id": "x", "memory_budget_gib": 5},
    {"stats": [1, 2], "memory_budget_gib": 5},
    {"stats": EXAMPLE_STATS, "memory_budget_gib": 5, "time_limit_s": 10**6},
    {"stats": EXAMPLE_STATS, "memory_budget_gib": 5, "world_size": True},
    {"stats": {**EXAMPLE_STATS, "modules": []}, "memory_budget_gib": 5},
    {"stats_id": "nope", "memory_budget_gib": 5},
])
def test_large_plan_bodies_get_the_answers_small_ones_get(client, count_rows, request_body):
    body = json.dumps(request_body).encode()
    small = client.post("/v1/plans", content=body, headers=JSON)
    large = client.post("/v1/plans", content=body + PAD, headers=JSON)
    assert small.status_code in (404, 422), small.text
    assert (large.status_code, large.json()) == (small.status_code, small.json())
    assert count_rows() == {"stats": 0, "stats_tags": 0, "plans": 0, "sweeps": 0}


def test_the_time_limit_counts_from_the_requests_arrival(settings, solver, count_rows):
    # The body takes 1.5 s to arrive; with time_limit_s=1 nothing is left to solve with once it is in. The route's
    # clock used to start after the body was read: the plan was solved in full and stored.
    app = create_app(settings, solver=solver)
    body = json.dumps({"stats": EXAMPLE_STATS, "memory_budget_gib": 5, "time_limit_s": 1}).encode()

    async def slow_body():
        yield body[:100]
        await asyncio.sleep(1.5)
        yield body[100:]

    async def main():
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as c:
                return await c.post("/v1/plans", content=slow_body(), headers=JSON)

    r = asyncio.run(main())
    assert r.status_code == 200 and r.json()["status"] == "time_limit", r.text[:300]
    assert count_rows()["plans"] == 0


@pytest.mark.parametrize("path", ["/v1/plans", "/v1/sweeps"])
def test_a_time_limit_no_solve_can_use_is_422(client, count_rows, path):
    extra = {"memory_budget_gib": 5} if path == "/v1/plans" else {"budgets_gib": [5]}
    for sent in (1e-300, MIN_TIME_LIMIT_S / 2):
        r = client.post(path, json={"stats": EXAMPLE_STATS, "time_limit_s": sent, **extra})
        assert r.status_code == 422, r.text
        assert r.json()["errors"][0]["loc"] == ["body", "time_limit_s"] and r.json()["errors"][0]["input"] == sent
    assert count_rows()["plans"] == 0 and count_rows()["stats"] == 0
    assert client.post(path, json={"stats": EXAMPLE_STATS, "time_limit_s": MIN_TIME_LIMIT_S, **extra}).status_code \
        in (200, 201)
    schema = client.get("/openapi.json").json()["components"]["schemas"]["PlanRequest"]["properties"]["time_limit_s"]
    assert schema["minimum"] == MIN_TIME_LIMIT_S and "exclusiveMinimum" not in schema


@pytest.mark.parametrize(("encoding", "content_type", "status"), [
    ("utf-16", "application/json", 400), ("utf-16-le", "application/json", 400), ("utf-16-be", "application/json", 400),
    ("utf-32", "application/json", 400), ("utf-8-sig", "application/json", 400),
    ("utf-8", "application/json; charset=utf-16", 415), ("utf-8", "application/json; charset=latin-1", 415),
])
def test_bodies_are_utf8_json_only(client, count_rows, encoding, content_type, status):
    text = json.dumps(EXAMPLE_STATS)
    for path, body in (("/v1/stats", text), ("/v1/plans", json.dumps({"stats": EXAMPLE_STATS, "memory_budget_gib": 5}))):
        r = client.post(path, content=body.encode(encoding), headers={"content-type": content_type})
        assert r.status_code == status, (path, r.text)
        assert "UTF-8" in r.json()["detail"]
    assert count_rows()["stats"] == 0
    ok = client.post("/v1/stats", content=text.encode(), headers={"content-type": "application/json; charset=UTF-8"})
    assert ok.status_code == 201


def test_inline_stats_not_stored_in_time_are_answered_at_the_limit_storing_nothing(client, big_doc, count_rows):
    # Reading ~1.2 MiB of stats in a render process (starting it, json.loads, validation) takes well over the
    # smallest time limit: the answer said time_limit only once the stats were stored, with their stats_id.
    for path, extra in (("/v1/plans", {"memory_budget_gib": 1000}), ("/v1/sweeps", {"budgets_gib": [900, 1000]})):
        request = {"stats": big_doc, "time_limit_s": MIN_TIME_LIMIT_S, **extra}
        r = client.post(path, content=json.dumps(request).encode(), headers=JSON)
        assert r.status_code == 200, r.text[:500]
        out = r.json()
        assert (out["id"], out["stats_id"], out["baseline_peak_bytes"], out["compute_ms"]) == (None,) * 4
        statuses = [out["status"]] if path == "/v1/plans" else [p["status"] for p in out["points"]]
        assert statuses == ["time_limit"] * (1 if path == "/v1/plans" else 2)
        assert "nothing was stored" in out["message"] and "POST /v1/stats" in out["message"]
    # nothing stored, now or once the render process has stopped; the same stats are then stored in time
    r = client.post("/v1/sweeps", content=json.dumps({**request, "time_limit_s": 60}).encode(), headers=JSON)
    assert r.status_code == 201 and r.json()["stats_id"] is not None and "message" not in r.json(), r.text[:300]
    assert count_rows()["stats"] == 1

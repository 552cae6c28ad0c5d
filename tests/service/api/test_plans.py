"""POST/GET /v1/plans: the cache, single-flight, the bounded solver queue, charts."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest

from planner import PLANNER_VERSION
from service.main import create_app
from service.schemas import PlanOut
from service.solving import SolverPool
from metrics_text import sample

EXAMPLE_STATS = Path(__file__).resolve().parents[3] / "service" / "example_stats.json"


def _plan(client, stats_id, budget, **extra):
    return client.post("/v1/plans", json={"stats_id": stats_id, "memory_budget_gib": budget, **extra})


def _solves(client) -> float:
    return sample(client.get("/metrics").text, "sacplan_solves_started_total")


def test_plan_then_cached_without_a_solve(client, example_id, count_rows):
    first = _plan(client, example_id, 4.5, time_limit_s=30)
    assert first.status_code == 201, first.text
    plan = PlanOut.model_validate(first.json())
    assert plan.cached is False and first.headers["x-cache"] == "miss"
    assert plan.status == "optimal", plan.message
    assert plan.peak_bytes <= 4.5 * 2**30
    assert plan.planner_version == PLANNER_VERSION
    rows, solves = count_rows()["plans"], _solves(client)

    again = _plan(client, example_id, 4.5, time_limit_s=30)
    assert again.status_code == 200
    assert again.json()["cached"] is True and again.headers["x-cache"] == "hit"
    assert again.json()["id"] == plan.id
    assert {k: v for k, v in again.json().items() if k != "cached"} == {
        k: v for k, v in first.json().items() if k != "cached"}
    assert _solves(client) == solves  # no solver job started
    assert count_rows()["plans"] == rows

    read = client.get(f"/v1/plans/{plan.id}")
    assert read.status_code == 200 and read.json()["status"] == "optimal"


def test_every_result_changing_field_is_in_the_cache_key(client, example_id, count_rows):
    base = {"time_limit_s": 30}
    ids = {_plan(client, example_id, 4.5, **base).json()["id"]}
    for change in ({"world_size": 2}, {"time_limit_s": 31}, {"ac_units": ["Net.layers.0"]},
                   {"fsdp_units": ["Net.layers.0", "Net.layers.1"]}, {"mip_rel_gap": 0.01}):
        r = _plan(client, example_id, 4.5, **{**base, **change})
        assert r.status_code == 201, (change, r.text)
        assert r.json()["cached"] is False, change
        ids.add(r.json()["id"])
    assert len(ids) == 6
    assert count_rows()["plans"] == 6
    # Unit lists are sets: another order is the same request.
    r = _plan(client, example_id, 4.5, **base, fsdp_units=["Net.layers.1", "Net.layers.0"])
    assert r.json()["cached"] is True


def test_every_planner_option_is_a_request_field(client, example_id, count_rows):
    # One options model (planner.PlanOptions) serves Python, the CLI and this API: the options
    # that were Python- and CLI-only are request fields too, each part of the cache key.
    import planner

    base = {"time_limit_s": 30}
    first = _plan(client, example_id, 4.5, **base).json()
    for change in ({"solver": "milp"}, {"first_step_only": True}, {"reserve_gib": 0.25}):
        r = _plan(client, example_id, 4.5, **{**base, **change})
        assert r.status_code == 201, (change, r.text)
        assert r.json()["cached"] is False, change
        assert r.json()["request"][next(iter(change))] == next(iter(change.values()))
    reserved = _plan(client, example_id, 4.5, **base, reserve_gib=0.25).json()
    assert reserved["cached"] is True
    assert reserved["baseline_peak_bytes"] == first["baseline_peak_bytes"] + 2**28  # the reserve is counted
    # offload's options are in the key only with offload on (an off plan ignores them)
    assert set(first["request"]) == set(planner.PlanOptions.model_fields) - {"offload", "host_link_gbps",
                                                                               "host_budget_gib"} \
        | {"memory_budget_gib"}
    assert _plan(client, example_id, 4.5, **base, host_link_gbps=24).json()["cached"] is True  # unused when off
    # offload needs the step's timeline: the service's example document has one
    with_timeline = client.post("/v1/stats", json=json.loads(EXAMPLE_STATS.read_text())).json()["id"]
    offloading = _plan(client, with_timeline, 0.78, **base, offload="on", host_link_gbps=24)
    assert offloading.status_code == 201 and offloading.json()["cached"] is False, offloading.text
    assert set(offloading.json()["request"]) == set(planner.PlanOptions.model_fields) - {"host_budget_gib"} \
        | {"memory_budget_gib"}  # the host memory cap only when set
    assert offloading.json()["offload"] == "on" and offloading.json()["host_link_gbps"] == {"d2h": 24, "h2d": 24}
    capped = _plan(client, with_timeline, 0.78, **base, offload="on", host_link_gbps=24, host_budget_gib=1e-3)
    assert capped.status_code == 201 and capped.json()["cached"] is False, capped.text
    assert capped.json()["request"]["host_budget_gib"] == 1e-3 and capped.json()["host_bytes"] <= 1e-3 * 2**30
    bad = _plan(client, example_id, 4.5, solver="cbc")
    assert bad.status_code == 422 and bad.json()["detail"].startswith("body.solver: solver must be 'auto'")


def test_infeasible_budget_is_a_stored_plan_with_minimum(client, example_id):
    r = _plan(client, example_id, 0.5, time_limit_s=30)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["status"] == "infeasible"
    assert body["min_feasible_budget_gib"] is not None and body["min_feasible_budget_gib"] > 0.5


@pytest.mark.parametrize(
    ("extra", "field"),
    [({"memory_budget_gib": -1}, "memory_budget_gib"), ({"memory_budget_gib": 1e308}, "memory_budget_gib"),
     ({"world_size": 0}, "world_size"), ({"world_size": 10**30}, "world_size"),
     ({"time_limit_s": 0}, "time_limit_s"), ({"time_limit_s": 10**6}, "time_limit_s"),
     ({"mip_rel_gap": -0.1}, "mip_rel_gap"), ({"mip_rel_gap": 1}, "mip_rel_gap"),
     ({"stats_id": 10**30}, "stats_id"), ({"surprise": 1}, "surprise"), ({"ac_units": "Net"}, "ac_units")],
)
def test_bad_plan_requests_are_422(client, example_id, count_rows, extra, field):
    r = client.post("/v1/plans", json={"stats_id": example_id, "memory_budget_gib": 4.5, **extra})
    assert r.status_code == 422, r.text
    assert field in r.json()["detail"]
    assert count_rows()["plans"] == 0


def test_nan_budget_is_422(client, example_id):
    body = b'{"stats_id": "%s", "memory_budget_gib": NaN}' % example_id.encode()
    r = client.post("/v1/plans", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422
    r = client.post("/v1/plans", content=b"stats_id=1", headers={"content-type": "text/plain"})
    assert r.status_code == 422


def test_planner_rejection_is_422_and_stores_nothing(client, example_id, count_rows):
    r = _plan(client, example_id, 4.5, ac_units=["Net.no_such_module"])
    assert r.status_code == 422, r.text
    assert "Net.no_such_module" in r.json()["detail"]
    assert count_rows()["plans"] == 0


# fixed ids (never random): parallel workers must collect the same test names
@pytest.mark.parametrize("unknown", ["0267945b-badc-4769-b095-1b8a3c39dab7", "999", "abc", "x" * 200,
                                     "8AB4C8E3-2A81-4A81-BAE5-1EBDCD421B99"])
def test_unknown_and_malformed_ids_are_404_alike(client, example_id, unknown):
    shown = unknown if len(unknown) <= 36 else f"({len(unknown)} characters, longer than any id)"  # never echoed
    expected = {"detail": f"stats_id {shown} does not exist"}
    r = _plan(client, unknown, 4.5)
    assert (r.status_code, r.json()) == (404, expected)
    for path in (f"/v1/plans/{unknown}", f"/v1/plans/{unknown}/chart.png"):
        r = client.get(path)
        assert (r.status_code, r.json()) == (404, {"detail": f"plan id {shown} does not exist"})


def test_chart_is_a_png(client, example_id, assert_png):
    plan_id = _plan(client, example_id, 4.5, time_limit_s=30).json()["id"]
    r = client.get(f"/v1/plans/{plan_id}/chart.png")
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    assert_png(r.content)


def test_stats_plans_listing_and_delete_cascade(client, example_id, count_rows):
    for b in (4.5, 5.0):
        assert _plan(client, example_id, b, time_limit_s=30).status_code == 201
    listing = client.get(f"/v1/stats/{example_id}/plans").json()
    assert [p["memory_budget_gib"] for p in listing["items"]] == [4.5, 5.0]
    assert client.delete(f"/v1/stats/{example_id}").status_code == 204
    assert count_rows()["plans"] == 0
    assert client.get(f"/v1/plans/{listing['items'][0]['id']}").status_code == 404


def _concurrently(app, run):
    """``await run(client)`` with an async client on ``app`` (requests really overlap)."""
    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await run(c)

    return asyncio.run(main())


def test_concurrent_identical_requests_run_one_solve(settings, solver, example_doc, count_rows):
    async def run(c):
        stats_id = (await c.post("/v1/stats", json=example_doc)).json()["id"]
        before = solver.solves_started
        req = {"stats_id": stats_id, "memory_budget_gib": 5.0, "time_limit_s": 30}
        return before, await asyncio.gather(*(c.post("/v1/plans", json=req) for _ in range(6)))

    before, answers = _concurrently(create_app(settings, solver=solver), run)
    assert sorted(a.status_code for a in answers) == [200] * 5 + [201], [a.text for a in answers]
    assert solver.solves_started == before + 1
    assert len({a.json()["id"] for a in answers}) == 1
    assert sum(not a.json()["cached"] for a in answers) == 1
    assert count_rows()["plans"] == 1


def test_callers_sharing_a_rejected_solve_each_get_their_own_index(settings, solver, example_doc, count_rows):
    # The two requests differ only in unit order, so they share one solve (the key sorts units);
    # each answer must name the bad unit at its own position in the list that caller sent.
    orders = (["Net.layers.0", "Zbad"], ["Zbad", "Net.layers.0"]) * 3

    async def run(c):
        stats_id = (await c.post("/v1/stats", json=example_doc)).json()["id"]
        before = solver.solves_started
        return before, await asyncio.gather(*(c.post("/v1/plans", json={
            "stats_id": stats_id, "memory_budget_gib": 4.5, "ac_units": units}) for units in orders))

    before, answers = _concurrently(create_app(settings, solver=solver), run)
    assert solver.solves_started == before + 1  # one shared solve
    for units, a in zip(orders, answers):
        assert a.status_code == 422, a.text
        k = units.index("Zbad")
        assert a.json()["detail"].startswith(f"ac_units[{k}] 'Zbad' is not a module")
        assert a.json()["errors"][0]["loc"] == ["body", "ac_units", str(k)]
    assert count_rows()["plans"] == 0


def test_full_solver_queue_is_503_with_retry_after(settings, example_doc, count_rows):
    pool = SolverPool(workers=1, queue_size=0, retry_after_s=7)
    app = create_app(settings, solver=pool)

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            stats_id = (await c.post("/v1/stats", json=example_doc)).json()["id"]
            busy = asyncio.ensure_future(pool.run(time.sleep, 1.0))  # holds the only slot
            while pool.in_flight == 0:
                await asyncio.sleep(0.01)
            r = await c.post("/v1/plans", json={"stats_id": stats_id, "memory_budget_gib": 5.0})
            health = await c.get("/healthz")  # not blocked by the running job
            page = (await c.get("/metrics")).text
            await busy
            return r, health, page

    try:
        r, health, page = asyncio.run(run())
    finally:
        pool.shutdown()
    assert r.status_code == 503
    assert r.headers["retry-after"] == "7"
    assert health.status_code == 200
    assert sample(page, "sacplan_solver_queue_depth") == 1
    assert count_rows()["plans"] == 0


@pytest.mark.parametrize(
    ("extra", "field", "sent"),
    [({"memory_budget_gib": True}, "memory_budget_gib", "true"),  # was planned at 1 GiB
     ({"memory_budget_gib": "5"}, "memory_budget_gib", '"5"'),
     ({"stats_id": 1}, "stats_id", "1"), ({"stats_id": True}, "stats_id", "true"),
     ({"world_size": True}, "world_size", "true"), ({"world_size": "2"}, "world_size", '"2"'),
     ({"world_size": 2.5}, "world_size", "2.5"), ({"world_size": 2**20 + 1}, "world_size", "1048577"),
     ({"time_limit_s": "30"}, "time_limit_s", '"30"'), ({"time_limit_s": True}, "time_limit_s", "true"),
     ({"mip_rel_gap": "0.01"}, "mip_rel_gap", '"0.01"'), ({"mip_rel_gap": False}, "mip_rel_gap", "false")],
)
def test_numbers_are_not_coerced(client, example_id, count_rows, extra, field, sent):
    r = client.post("/v1/plans", json={"stats_id": example_id, "memory_budget_gib": 4.5, **extra})
    assert r.status_code == 422, r.text
    body = r.json()
    assert f"body.{field}: " in body["detail"] and f"(got {sent})" in body["detail"]
    [error] = body["errors"]
    assert error["loc"] == ["body", field] and error["input"] == extra[field]
    assert count_rows()["plans"] == 0


def test_integer_budget_is_a_number_of_gib(client, example_id):
    r = _plan(client, example_id, 5, time_limit_s=30)  # JSON 5, not 5.0: a number all the same
    assert r.status_code == 201 and r.json()["memory_budget_gib"] == 5.0


def _shape(r) -> None:
    assert r.status_code == 422, r.text
    body = r.json()
    assert set(body) == {"detail", "errors"} and body["errors"]
    for e in body["errors"]:
        assert set(e) == {"loc", "msg", "input"}
        assert not e["msg"].startswith("Value error")
    assert "Value error" not in body["detail"]


def test_every_422_has_the_same_shape(client, example_id, example_doc):
    _shape(_plan(client, example_id, -1))  # the schema's
    _shape(_plan(client, example_id, 4.5, ac_units=["Net"]))  # the planner's
    _shape(_plan(client, example_id, 4.5, time_limit_s=601))  # the service's own bound
    example_doc["modules"][2]["parent"] = "Net"
    _shape(client.post("/v1/stats", json=example_doc))  # the stats'
    _shape(client.post("/v1/sweeps", json={"stats_id": example_id}))  # a model validator's


def test_planner_rejection_names_the_field_as_sent(client, example_id, count_rows):
    # The planner sees the unit lists sorted (as cached): its ac_units[0] is the client's ac_units[1].
    r = _plan(client, example_id, 4.5, ac_units=["Net.layers.0", "Net"])
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith("ac_units[1] 'Net' is the root module")
    assert r.json()["errors"] == [{"loc": ["body", "ac_units", "1"], "msg": r.json()["detail"], "input": "Net"}]
    r = _plan(client, example_id, 4.5, fsdp_units=["Net.layers.1", "Net.layers.0", "Net.nowhere"])
    assert r.json()["detail"].startswith("fsdp_units[2] 'Net.nowhere' is not a module")
    assert r.json()["errors"][0]["loc"] == ["body", "fsdp_units", "2"]
    assert count_rows()["plans"] == 0


def _time_limit_maximum(client, schema: str) -> float:
    return client.get("/openapi.json").json()["components"]["schemas"][schema]["properties"]["time_limit_s"]["maximum"]


@pytest.mark.parametrize("max_time_limit_s", [600.0, 7200.0, 20.0])
def test_documented_time_limit_is_the_enforced_one(make_client, settings, example_doc, max_time_limit_s):
    client = make_client(settings.model_copy(update={"max_time_limit_s": max_time_limit_s}))
    assert _time_limit_maximum(client, "PlanRequest") == max_time_limit_s
    assert _time_limit_maximum(client, "SweepRequest") == max_time_limit_s
    stats_id = client.post("/v1/stats", json=example_doc).json()["id"]
    over = _plan(client, stats_id, 4.5, time_limit_s=max_time_limit_s + 1)
    assert over.status_code == 422 and f"time_limit_s {max_time_limit_s + 1}" in over.json()["detail"]
    assert over.json()["errors"][0]["loc"] == ["body", "time_limit_s"]
    sweep = client.post("/v1/sweeps", json={"stats_id": stats_id, "budgets_gib": [4.5],
                                            "time_limit_s": max_time_limit_s + 1})
    assert sweep.status_code == 422
    at_max = _plan(client, stats_id, 4.5, time_limit_s=max_time_limit_s)
    assert at_max.status_code == 201, at_max.text


@pytest.mark.parametrize("field", ["ac_units", "fsdp_units", "budget_text", "extra_key"])
def test_lone_surrogates_are_422_not_500(client, example_id, count_rows, field):
    # "\\ud800" is valid JSON but no Unicode character: the answer must still encode
    body = {"ac_units": f'{{"stats_id": {example_id}, "memory_budget_gib": 4.5, "ac_units": ["\\ud800"]}}',
            "fsdp_units": f'{{"stats_id": {example_id}, "memory_budget_gib": 4.5, "fsdp_units": ["x\\udc00"]}}',
            "budget_text": f'{{"stats_id": {example_id}, "memory_budget_gib": "\\ud800"}}',
            "extra_key": f'{{"stats_id": {example_id}, "memory_budget_gib": 4.5, "\\ud800": 1}}'}[field]
    r = client.post("/v1/plans", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["errors"] and r.json()["detail"]
    assert count_rows()["plans"] == 0


def test_stats_with_a_lone_surrogate_are_422(client, example_doc, count_rows):
    import json as _json

    text = _json.dumps(example_doc).replace('"model_name": "', '"model_name": "\\ud800', 1)
    r = client.post("/v1/stats", content=text, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert "metadata.model_name" in r.json()["detail"]
    assert count_rows()["stats"] == 0

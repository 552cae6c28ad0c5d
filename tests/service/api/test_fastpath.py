"""The cached-plan fast path (service.api.fastpath): same bytes as the routes, same access control, never stale."""

from __future__ import annotations

import pytest

from service.api import CachedResponse, PlanResponseCache

KEY_A = "key-a-0123456789abcdef"
KEY_B = "key-b-fedcba9876543210"


def _as(key):
    return {"Authorization": f"Bearer {key}"}


def _cache(client) -> PlanResponseCache:
    return client.app.state.plan_responses


def _answer(r) -> tuple:
    """Everything a client sees of a response (TestClient adds no date/server headers)."""
    return r.status_code, sorted(r.headers.items()), r.content


@pytest.fixture
def slow_client(make_client, settings):
    """The same database behind an app with the fast path off: the reference answers."""
    return make_client(settings.model_copy(update={"plan_response_cache_entries": 0}))


@pytest.fixture
def plan(client, example_id):
    r = client.post("/v1/plans", json={"stats_id": example_id, "memory_budget_gib": 5.0, "time_limit_s": 30})
    assert r.status_code == 201 and r.headers["x-cache"] == "miss", r.text
    return r.json()


def test_get_is_answered_from_the_cache_byte_for_byte(client, slow_client, plan):
    path = f"/v1/plans/{plan['id']}"
    first = client.get(path)  # a miss: the routes answer and the response is kept
    assert _cache(client).hits == 0 and len(_cache(client)) == 1
    again = [client.get(path) for _ in range(3)]
    assert _cache(client).hits == 3
    reference = slow_client.get(path)
    assert _cache(slow_client).hits == 0 and len(_cache(slow_client)) == 0
    assert reference.status_code == 200 and reference.headers["x-cache"] == "hit"
    for r in [first, *again]:
        assert _answer(r) == _answer(reference)


def test_repeated_post_is_answered_from_the_cache_byte_for_byte(client, slow_client, plan, example_id):
    body = b'{"stats_id": "%s", "memory_budget_gib": 5.0, "time_limit_s": 30}' % example_id.encode()
    headers = {"content-type": "application/json"}
    first = client.post("/v1/plans", content=body, headers=headers)  # a store hit, kept here
    assert first.json()["cached"] is True and _cache(client).hits == 0
    again = client.post("/v1/plans", content=body, headers=headers)
    assert _cache(client).hits == 1
    reference = slow_client.post("/v1/plans", content=body, headers=headers)
    assert _answer(first) == _answer(again) == _answer(reference)
    # Another body (same meaning, other bytes) is its own key: the routes answer it.
    other = client.post("/v1/plans", content=body.replace(b" ", b""), headers=headers)
    assert _cache(client).hits == 1 and other.content == reference.content


def test_a_solve_is_not_kept_but_its_repeat_is(client, example_id):
    req = {"stats_id": example_id, "memory_budget_gib": 4.5, "time_limit_s": 30}
    assert client.post("/v1/plans", json=req).headers["x-cache"] == "miss"
    assert len(_cache(client)) == 0  # "cached": false must never be replayed
    assert client.post("/v1/plans", json=req).json()["cached"] is True
    assert client.post("/v1/plans", json=req).json()["cached"] is True
    assert _cache(client).hits == 1


@pytest.fixture
def auth_client(make_client, settings):
    return make_client(settings.model_copy(update={"api_keys": {KEY_A: "alpha", KEY_B: "beta"}}))


def test_fast_path_keeps_keys_and_projects(auth_client, example_doc):
    stats_id = auth_client.post("/v1/stats", json=example_doc, headers=_as(KEY_A)).json()["id"]
    req = {"stats_id": stats_id, "memory_budget_gib": 5.0, "time_limit_s": 30}
    plan_id = auth_client.post("/v1/plans", json=req, headers=_as(KEY_A)).json()["id"]
    path = f"/v1/plans/{plan_id}"
    for _ in range(2):  # keep both responses, then hit them
        assert auth_client.get(path, headers=_as(KEY_A)).status_code == 200
        assert auth_client.post("/v1/plans", json=req, headers=_as(KEY_A)).status_code == 200
    assert _cache(auth_client).hits == 2

    cases = [({}, 401), ({"Authorization": KEY_A}, 401), (_as(KEY_A[:-1] + "x"), 401), (_as(""), 401),
             ({"Authorization": f"Basic {KEY_A}"}, 401), (_as(KEY_B), 404)]
    for headers, status in cases:
        got = auth_client.get(path, headers=headers)
        assert got.status_code == status, (headers, got.text)
        assert auth_client.post("/v1/plans", json=req, headers=headers).status_code == status, headers
        if status == 401:
            assert got.headers["www-authenticate"] == "Bearer"
    assert _cache(auth_client).hits == 2  # none of those came from the cache
    assert auth_client.get(path, headers={"authorization": f"bearer {KEY_A}"}).status_code == 200


def test_deleting_the_stats_drops_its_responses(client, plan, example_id):
    path = f"/v1/plans/{plan['id']}"
    req = {"stats_id": example_id, "memory_budget_gib": 5.0, "time_limit_s": 30}
    client.get(path)
    client.post("/v1/plans", json=req)
    assert len(_cache(client)) == 2
    assert client.delete(f"/v1/stats/{example_id}").status_code == 204
    assert len(_cache(client)) == 0
    assert client.get(path).status_code == 404
    assert client.post("/v1/plans", json=req).status_code == 404
    assert _cache(client).hits == 0


def test_a_delete_in_another_process_is_never_served_stale(client, make_client, settings, plan, example_id):
    """Two apps on one database stand for two uvicorn workers, each with its own cache."""
    other = make_client(settings)
    path = f"/v1/plans/{plan['id']}"
    req = {"stats_id": example_id, "memory_budget_gib": 5.0, "time_limit_s": 30}
    for _ in range(2):
        assert other.get(path).status_code == 200
        assert other.post("/v1/plans", json=req).status_code == 200
    assert _cache(other).hits == 2
    assert client.delete(f"/v1/stats/{example_id}").status_code == 204
    assert len(_cache(other)) == 2  # it was not told...
    assert other.get(path).status_code == 404  # ...but checks the row before every answer
    assert other.post("/v1/plans", json=req).status_code == 404
    assert _cache(other).hits == 2 and len(_cache(other)) == 0


def test_a_reused_plan_id_is_not_served_the_old_plan(client, make_client, settings, example_doc):
    """SQLite may hand a deleted row's id to the next row: the old response must not come back."""
    other = make_client(settings)
    first_stats = client.post("/v1/stats", json=example_doc).json()["id"]
    old = client.post("/v1/plans", json={"stats_id": first_stats, "memory_budget_gib": 5.0}).json()
    other.get(f"/v1/plans/{old['id']}")
    assert client.delete(f"/v1/stats/{first_stats}").status_code == 204
    example_doc["metadata"]["tags"] = {"team": "other"}
    second_stats = client.post("/v1/stats", json=example_doc).json()["id"]
    new = client.post("/v1/plans", json={"stats_id": second_stats, "memory_budget_gib": 4.5}).json()
    got = other.get(f"/v1/plans/{new['id']}")
    assert got.status_code == 200 and got.json()["memory_budget_gib"] == 4.5
    assert got.json()["created_at"] == new["created_at"]


def _entry(n: int, size: int, stats_id: int = 1) -> CachedResponse:
    return CachedResponse(n, stats_id, (stats_id, "t", "p"), {"type": "http.response.start", "status": 200},
                          b"x" * size)


def test_the_cache_is_bounded_in_entries_least_recently_used_first():
    cache = PlanResponseCache(max_entries=2, max_bytes=1000)
    cache.put(("a",), _entry(1, 10))
    cache.put(("b",), _entry(2, 10))
    assert cache.get(("a",)) is not None  # now "b" is the least recently used
    cache.put(("c",), _entry(3, 10))
    assert len(cache) == 2 and cache.get(("b",)) is None
    assert cache.get(("a",)).plan_id == 1 and cache.get(("c",)).plan_id == 3
    assert cache.size_bytes == 20


def test_the_cache_is_bounded_in_bytes():
    cache = PlanResponseCache(max_entries=100, max_bytes=100)
    for i in range(5):
        cache.put((i,), _entry(i, 40))
    assert len(cache) == 2 and cache.size_bytes == 80 and cache.get((4,)) is not None
    cache.put(("big",), _entry(9, 101))  # larger than the whole cache: not kept, nothing evicted
    assert cache.get(("big",)) is None and len(cache) == 2
    cache.put((4,), _entry(4, 10))  # replacing an entry recounts its bytes
    assert cache.size_bytes == 50
    cache.drop_stats(1)
    assert len(cache) == 0 and cache.size_bytes == 0

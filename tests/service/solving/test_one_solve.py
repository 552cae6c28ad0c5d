"""Identical concurrent requests are solved once across worker processes and replicas on one database.

Real servers (``sacplan serve``) on 127.0.0.1; every request on its own
connection, so the kernel spreads them over the worker processes; the count of
solves is the services' own ``sacplan_solves_started_total`` summed over all
their processes (``/metrics``).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from live_server import Server
from metrics_text import sample
from conftest import L4_PATH

REQUESTS = 20


def _post_all(urls: list[str], path: str, body: dict) -> list[httpx.Response]:
    def one(k: int) -> httpx.Response:
        with httpx.Client(base_url=urls[k % len(urls)], timeout=120) as c:  # a new connection each
            return c.post(path, json=body)

    with ThreadPoolExecutor(REQUESTS) as pool:
        return list(pool.map(one, range(REQUESTS)))


def _solves(servers: list[Server]) -> float:
    return sum(sample(httpx.get(s.url + "/metrics").text, "sacplan_solves_started_total") for s in servers)


@pytest.fixture
def servers(tmp_path: Path, db_url: str, request):
    """``request.param`` = (replicas, workers each): servers on one database (SQLite, or PostgreSQL)."""
    replicas, workers = request.param
    data = tmp_path / "data"
    data.mkdir()
    running = [Server(data, database_url=db_url, workers=workers) for _ in range(replicas)]
    for k, s in enumerate(running):
        s.log = data / f"server{k}.log"
        s.start()
    yield running
    for s in running:
        s.stop()


# Two workers of one server for plans, two replicas for sweeps: both kinds of request, both ways of sharing.
@pytest.mark.parametrize("servers,route", [((1, 2), "/v1/plans"), ((2, 1), "/v1/sweeps")],
                         ids=["plans-workers-2", "sweeps-two-replicas"], indirect=["servers"])
def test_identical_concurrent_requests_are_solved_once(servers, route):
    urls = [s.url for s in servers]
    stats_id = httpx.post(urls[0] + "/v1/stats", json=json.loads(L4_PATH.read_text()), timeout=60).json()["id"]
    body = {"stats_id": stats_id, "time_limit_s": 60}
    body.update({"memory_budget_gib": 4.5} if route == "/v1/plans" else {"budgets_gib": [4.0, 4.5, 5.0]})
    before = _solves(servers)
    answers = _post_all(urls, route, body)
    assert all(a.status_code in (200, 201) for a in answers), [a.text for a in answers]
    seen = [(a.status_code, a.json().get("id"), a.json().get("cached")) for a in answers]
    logs = "\n".join(s.log.read_text()[-2000:] for s in servers)
    assert _solves(servers) == before + 1, (seen, logs)
    ids = {a.json()["id"] for a in answers}
    assert len(ids) == 1 and None not in ids, seen  # the same stored answer for every caller
    assert sum(a.status_code == 201 for a in answers) == 1, seen

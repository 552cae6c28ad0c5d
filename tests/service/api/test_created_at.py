"""One time format: every created_at is ISO 8601 in UTC ending in Z, whichever route and path answered."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from service.schemas import SweepOut
from service.store import new_id
from service.times import iso_utc

Z_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z")


def test_every_created_at_ends_in_z(client, example_id):
    times = [client.get(f"/v1/stats/{example_id}").json()["created_at"],
             client.get("/v1/stats").json()["items"][0]["created_at"]]
    request = {"stats_id": example_id, "memory_budget_gib": 5.0, "time_limit_s": 30}
    solved = client.post("/v1/plans", json=request).json()
    plan_path = f"/v1/plans/{solved['id']}"
    times += [solved["created_at"], client.post("/v1/plans", json=request).json()["created_at"],
              *(client.get(plan_path).json()["created_at"] for _ in range(2)),  # the routes, then the fast path
              client.get(f"/v1/stats/{example_id}/plans").json()["items"][0]["created_at"]]
    sweep = client.post("/v1/sweeps", json={"stats_id": example_id, "budgets_gib": [5.0, 6.0], "time_limit_s": 30})
    times += [sweep.json()["created_at"], client.get(f"/v1/sweeps/{sweep.json()['id']}").json()["created_at"]]
    assert client.app.state.plan_responses.hits >= 1
    for t in times:
        assert Z_TIME.fullmatch(t), t
    assert len(set(times[2:6])) == 1  # one plan, one time, however served


def test_times_in_another_zone_are_written_in_utc():
    berlin = datetime(2025, 1, 31, 13, 0, 0, 250_000, tzinfo=timezone(timedelta(hours=1)))
    assert iso_utc(berlin) == "2025-01-31T12:00:00.250000Z"
    assert iso_utc(datetime(2025, 1, 31, 12, 0)) == "2025-01-31T12:00:00Z"  # naive, as SQLite answers: UTC
    out = SweepOut(id=new_id(), stats_id=new_id(), cached=True, created_at=berlin, baseline_peak_bytes=1, compute_ms=1.0,
                   points=[], chart_url=None)
    assert out.model_dump(mode="json")["created_at"] == iso_utc(berlin)

"""An id longer than any id can be is not echoed back (issue 33: a 100k-character id came back in the 404)."""

from __future__ import annotations

import pytest

from service.store import ID_LENGTH

LONG = "a" * 60_000  # the test client's URL limit is 65536 characters


@pytest.mark.parametrize("path", ["/v1/plans/{}", "/v1/stats/{}", "/v1/sweeps/{}", "/v1/stats/{}/plans",
                                  "/v1/plans/{}/chart.png", "/v1/sweeps/{}/chart.png"])
def test_a_long_id_in_the_path_is_not_echoed(client, path):
    r = client.get(path.format(LONG))
    assert r.status_code == 404
    assert "a" * (ID_LENGTH + 1) not in r.text and len(r.content) < 200, r.text
    assert "60000 characters" in r.json()["detail"]


def test_a_long_stats_id_in_a_body_is_not_echoed(client):
    for stats_id in ("b" * 200, LONG):
        r = client.post("/v1/plans", json={"stats_id": stats_id, "memory_budget_gib": 1.0})
        assert r.status_code in (404, 422) and len(r.content) < 600, r.text
        assert "b" * (ID_LENGTH + 1) not in r.text


def test_an_id_length_string_is_still_named(client):
    r = client.get("/v1/plans/" + "c" * ID_LENGTH)
    assert r.status_code == 404 and "c" * ID_LENGTH in r.json()["detail"]

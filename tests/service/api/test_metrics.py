"""/metrics: Prometheus text, what it counts, who may read it; /healthz tells nothing about load or tenants."""

from __future__ import annotations

import pytest
from metrics_text import sample
from pydantic import SecretStr, ValidationError

from service.config import Settings


def test_requests_are_counted_by_route_template_and_status(client, example_id):
    before = sample(client.get("/metrics").text, "sacplan_requests_total", route="/v1/stats/{stats_id}",
                    method="GET", status="200")
    missing = sample(client.get("/metrics").text, "sacplan_requests_total", route="/v1/stats/{stats_id}",
                     method="GET", status="404")
    assert client.get(f"/v1/stats/{example_id}").status_code == 200
    assert client.get("/v1/stats/999999").status_code == 404
    page = client.get("/metrics")
    assert page.headers["content-type"].startswith("text/plain")
    assert sample(page.text, "sacplan_requests_total", route="/v1/stats/{stats_id}", method="GET",
                  status="200") == before + 1
    assert sample(page.text, "sacplan_requests_total", route="/v1/stats/{stats_id}", method="GET",
                  status="404") == missing + 1
    assert sample(page.text, "sacplan_request_seconds_count", route="/v1/stats/{stats_id}", method="GET") >= 2


def test_cache_hits_are_counted(client, example_id):
    body = {"stats_id": example_id, "memory_budget_gib": 4.5}
    assert client.post("/v1/plans", json=body).status_code == 201
    before = client.get("/metrics").text
    assert client.post("/v1/plans", json=body).status_code == 200  # from the store
    assert client.post("/v1/plans", json=body).status_code == 200  # the same bytes from the fast path
    after = client.get("/metrics").text
    for where in ("store", "fastpath"):
        assert sample(after, "sacplan_cache_hits_total", where=where) == \
            sample(before, "sacplan_cache_hits_total", where=where) + 1


def test_metrics_off_is_404(make_client, settings):
    assert make_client(settings.model_copy(update={"metrics": "off"})).get("/metrics").status_code == 404


def test_metrics_by_key(make_client, settings):
    client = make_client(settings.model_copy(update={"metrics": "key", "metrics_key": SecretStr("scrape-me")}))
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer scrape-me"}).status_code == 200


def test_metrics_by_key_needs_the_key_set():
    with pytest.raises(ValidationError, match="SACPLAN_METRICS_KEY is not set"):
        Settings(metrics="key")


def test_healthz_says_nothing_about_load(client):
    assert set(client.get("/healthz").json()) == {"status", "service_version", "planner_version"}

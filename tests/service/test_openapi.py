"""The OpenAPI document: what Swagger UI shows is what the service does."""

from __future__ import annotations

import pytest


def _schema_ref(response: dict) -> str:
    return response["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]


@pytest.mark.parametrize(("path", "model"), [("/v1/stats", "StatsSummary"), ("/v1/plans", "PlanOut"),
                                             ("/v1/sweeps", "SweepOut")])
def test_creating_routes_answer_201_new_and_200_known(client, path, model):
    responses = client.get("/openapi.json").json()["paths"][path]["post"]["responses"]
    assert _schema_ref(responses["201"]) == model and _schema_ref(responses["200"]) == model

"""The OpenAPI document: what Swagger UI shows is what the service does."""

from __future__ import annotations

import json

import pytest


def _schema_ref(response: dict) -> str:
    return response["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]


@pytest.mark.parametrize(("path", "model"), [("/v1/stats", "StatsSummary"), ("/v1/plans", "PlanOut"),
                                             ("/v1/sweeps", "SweepOut")])
def test_creating_routes_answer_201_new_and_200_known(client, path, model):
    responses = client.get("/openapi.json").json()["paths"][path]["post"]["responses"]
    assert _schema_ref(responses["201"]) == model and _schema_ref(responses["200"]) == model


KEY = "key-openapi-0123456789abcdef"


@pytest.mark.parametrize("path", ["/v1/stats", "/v1/plans", "/v1/sweeps"])
def test_body_refusals_before_routing_are_declared(client, path):
    # service.transport.middleware answers these before any route: 415 for a charset other than UTF-8, 503 when
    # the process holds its share of large bodies (beside the solver queue's 503 on solving routes)
    responses = client.get("/openapi.json").json()["paths"][path]["post"]["responses"]
    assert "UTF-8" in responses["415"]["description"]
    assert "SACPLAN_BODY_MEMORY_MB" in responses["503"]["description"]
    assert "ambiguous framing" in responses["400"]["description"]


def test_bearer_security_only_with_api_keys(client, make_client, settings):
    bare = client.get("/openapi.json").json()
    assert "securitySchemes" not in bare["components"]  # no Authorize button in Swagger UI
    assert not [op for op in _operations(bare) if "security" in op]  # and no locks
    keyed = make_client(settings.model_copy(update={"api_keys": {KEY: "alpha"}})).get("/openapi.json").json()
    assert keyed["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    for path, method, op in _operations(keyed, with_names=True):
        assert (op.get("security") == [{"HTTPBearer": []}]) == path.startswith("/v1/"), (method, path)


def _operations(spec: dict, *, with_names: bool = False):
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            yield (path, method, op) if with_names else op


def _fresh_client(make_client, settings, tmp_path, name: str):
    from service.store import upgrade

    fresh = settings.model_copy(update={"data_dir": tmp_path / name,
                                        "database_url": f"sqlite:///{tmp_path / name}.db"})
    upgrade(fresh.sqlalchemy_url)
    return make_client(fresh)


def _request_examples(spec: dict) -> list[tuple[str, dict]]:
    """(path, body) of every request example Swagger UI offers: named ones, and the request schemas' own."""
    found = []
    for path, _, op in _operations(spec, with_names=True):
        content = op.get("requestBody", {}).get("content", {}).get("application/json", {})
        found += [(path, e["value"]) for e in content.get("examples", {}).values()]
        ref = content.get("schema", {}).get("$ref", "").rsplit("/", 1)[-1]
        found += [(path, e) for e in spec["components"]["schemas"].get(ref, {}).get("examples", [])]
    return found


def test_every_request_example_succeeds_as_is_on_a_fresh_database(client, make_client, settings, tmp_path):
    examples = _request_examples(client.get("/openapi.json").json())
    # plans and sweeps: without and with offloading (service.examples)
    assert sorted(path for path, _ in examples) == ["/v1/plans", "/v1/plans", "/v1/stats", "/v1/sweeps",
                                                    "/v1/sweeps"]
    assert sorted(body.get("offload", "off") for path, body in examples if path != "/v1/stats") == [
        "off", "off", "on", "on"]
    for k, (path, body) in enumerate(examples):
        r = _fresh_client(make_client, settings, tmp_path, f"fresh{k}").post(path, json=body)
        assert r.status_code == 201, (path, r.text)
        answer = r.json()  # a plan, a sweep's points (every budget fits), or an upload (no status)
        statuses = [p["status"] for p in answer.get("points", [])] + [answer.get("status", "optimal")]
        assert set(statuses) == {"optimal"}, r.text
        if body.get("offload") == "on":  # the plan states what offloading costs, in every point of a sweep
            figures = answer.get("points") or [answer]
            assert all("step_overhead_ms" in p and "host_bytes" in p for p in figures), r.text
            assert path != "/v1/plans" or answer["host_link_gbps"] == {"d2h": 16.0, "h2d": 16.0}


def test_the_example_stats_target_a_device_of_the_table():
    from estimators.collect import device_names

    from service.examples import EXAMPLE_STATS

    assert EXAMPLE_STATS["metadata"]["target_device"] in device_names()


# The responses of the three steps and of reading their results back, each with an example of its model.
EXAMPLED = {("/v1/stats", "post", "201"): "StatsSummary", ("/v1/stats", "post", "200"): "StatsSummary",
            ("/v1/stats/{stats_id}", "get", "200"): "StatsDetail", ("/v1/plans", "post", "201"): "PlanOut",
            ("/v1/plans", "post", "200"): "PlanOut", ("/v1/plans/{plan_id}", "get", "200"): "PlanOut",
            ("/v1/sweeps", "post", "201"): "SweepOut", ("/v1/sweeps", "post", "200"): "SweepOut",
            ("/v1/sweeps/{sweep_id}", "get", "200"): "SweepOut",
            ("/v1/pipeline-plans", "post", "201"): "PipelinePlanOut", ("/v1/pipeline-plans", "post", "200"): "PipelinePlanOut",
            ("/v1/pipeline-plans/{pipeline_plan_id}", "get", "200"): "PipelinePlanOut"}


def test_response_examples_validate_against_their_models(client):
    from service import schemas

    seen = {}
    for path, method, op in _operations(client.get("/openapi.json").json(), with_names=True):
        for code, response in op["responses"].items():
            content = response.get("content", {}).get("application/json", {})
            if "example" in content:
                name = content["schema"]["$ref"].rsplit("/", 1)[-1]
                getattr(schemas, name).model_validate(content["example"])
                seen[(path, method, code)] = name
    assert seen == EXAMPLED


def _without_times(answer: dict) -> dict:
    """``answer`` without its times, and its ids (random) as ``<id k>`` in order of first appearance.

    So two answers compare equal when they name the same things in the same places.
    """
    import re

    from service.store import ID_PATTERN

    text = json.dumps({k: v for k, v in answer.items() if k not in ("created_at", "solve_seconds")}, sort_keys=True)
    seen: dict[str, str] = {}
    text = re.sub(ID_PATTERN[1:-1], lambda m: seen.setdefault(m[0], f"<id {len(seen)}>"), text)
    assert seen, "an answer with no id"
    return json.loads(text)


def test_response_examples_are_what_the_service_answers(client):
    """The examples come from the real planner: the three steps' examples, run on this fresh database, answer them."""
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]

    def example(path: str, method: str, code: str = "200") -> dict:
        return spec["paths"][path][method]["responses"][code]["content"]["application/json"]["example"]

    [(_, stats_body)] = [e for e in _request_examples(spec) if e[0] == "/v1/stats"]
    stats = client.post("/v1/stats", json=stats_body).json()
    plan = client.post("/v1/plans", json=schemas["PlanRequest"]["examples"][0]).json()
    sweep = client.post("/v1/sweeps", json=schemas["SweepRequest"]["examples"][0]).json()
    assert _without_times(stats) == _without_times(example("/v1/stats", "post", "201"))
    detail = client.get(f"/v1/stats/{stats['id']}").json()
    assert _without_times(detail) == _without_times(example("/v1/stats/{stats_id}", "get"))
    assert _without_times(plan) == _without_times(example("/v1/plans", "post", "201"))
    assert _without_times(sweep) == _without_times(example("/v1/sweeps", "post", "201"))
    # Read back or asked again: the 200 examples, every cached flag true.
    assert _without_times(client.get(f"/v1/plans/{plan['id']}").json()) == _without_times(
        example("/v1/plans/{plan_id}", "get"))
    again = client.post("/v1/sweeps", json=schemas["SweepRequest"]["examples"][0])
    assert _without_times(again.json()) == _without_times(example("/v1/sweeps", "post", "200"))
    assert _without_times(client.get(f"/v1/sweeps/{sweep['id']}").json()) == _without_times(
        example("/v1/sweeps/{sweep_id}", "get"))
    assert all(p["status"] == "optimal" for p in sweep["points"]) and sweep["points"][0]["cached"] is True


def test_error_answers_are_declared_as_sent(client, make_client, settings):
    # Issue 19: 422 was declared as FastAPI's (detail a list) while the service sends detail a string + errors.
    spec = client.get("/openapi.json").json()
    assert "HTTPValidationError" not in json.dumps(spec)
    for path, method, op in _operations(spec, with_names=True):
        for code, response in op["responses"].items():
            if code[0] == "4":
                assert _schema_ref(response) == "ErrorOut", (path, method, code)
        if "requestBody" in op:
            assert {"400", "413", "422"} <= set(op["responses"]), (path, method)
        assert "401" not in op["responses"]  # auth off: no 401 anywhere
    sent = client.post("/v1/plans", json={"stats_id": "x", "memory_budget_gib": -1}).json()
    from service.schemas import ErrorOut

    assert isinstance(ErrorOut.model_validate(sent).detail, str) and sent["errors"]
    keyed = make_client(settings.model_copy(update={"api_keys": {KEY: "alpha"}})).get("/openapi.json").json()
    for path, method, op in _operations(keyed, with_names=True):
        assert ("401" in op["responses"]) == path.startswith("/v1/"), (method, path)


def test_allow_names_every_method_of_the_path(client, example_id):
    # Starlette named only the first matching route's methods (POST for /v1/stats, which also has GET).
    spec = client.get("/openapi.json").json()
    for path, methods in [("/v1/stats", {"GET", "POST"}), (f"/v1/stats/{example_id}", {"GET", "DELETE"}),
                          ("/v1/plans", {"POST"})]:
        r = client.request("PATCH", path)
        assert r.status_code == 405 and set(r.headers["allow"].split(", ")) == methods, (path, r.headers)
        template = path.replace(example_id, "{stats_id}")
        assert {m.upper() for m in spec["paths"][template]} == methods


def test_schema_valid_requests_are_accepted_or_the_schema_says_no(client, example_id):
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    # JSON Schema's integer 10338.0 is an integer: taken as 10338 (2.5 is not one: 422).
    r = client.post("/v1/plans", json={"stats_id": example_id, "memory_budget_gib": 5.0, "world_size": 10338.0})
    assert r.status_code == 201 and r.json()["world_size"] == 10338, r.text
    assert schemas["PlanRequest"]["properties"]["world_size"]["type"] == "integer"
    # An empty tag, or one with no key, is outside the documented pattern, and refused.
    [tag] = [p for p in spec["paths"]["/v1/stats"]["get"]["parameters"] if p["name"] == "tag"]
    import re

    for value in ("", "=x"):
        assert not re.search(tag["schema"]["pattern"], value)
        assert client.get("/v1/stats", params={"tag": value}).status_code == 422
    # A sweep must give its budgets one way: the document's oneOf says so; with none it is 422.
    one_of = schemas["SweepRequest"]["oneOf"]
    assert all(any("budgets_gib" in part.get("required", ()) or "points" in part.get("required", ())
                   for part in alt["allOf"]) for alt in one_of)
    assert client.post("/v1/sweeps", json={"stats_id": example_id}).status_code == 422
    # Optional fields are not nullable, and an explicit null is refused as the document says.
    assert "null" not in json.dumps(schemas["PlanRequest"]["properties"]["stats_id"])
    assert client.post("/v1/plans", json={"stats_id": None, "stats": None, "memory_budget_gib": 5.0}).status_code == 422


def _validator(spec: dict, name: str):
    """A JSON Schema validator of ``components.schemas[name]``, its references resolved in ``spec``."""
    import jsonschema_rs

    return jsonschema_rs.validator_for({"$ref": f"#/components/schemas/{name}", "components": spec["components"]})


def test_stats_bodies_are_declared_with_the_stats_formats(client, l4_doc):
    """Swagger UI and ReDoc show the stats' fields (issue 32): the upload and inline stats name both formats."""
    import planner

    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    upload = spec["paths"]["/v1/stats"]["post"]["requestBody"]["content"]["application/json"]
    assert upload["schema"] == {"$ref": "#/components/schemas/StatsDocument"}
    for request in ("PlanRequest", "SweepRequest"):
        assert schemas[request]["properties"]["stats"]["$ref"] == "#/components/schemas/StatsDocument"
    assert {alt["$ref"].rsplit("/", 1)[-1] for alt in schemas["StatsDocument"]["oneOf"]} == {"Stats", "TorchStats"}
    assert schemas["Stats"]["properties"].keys() == planner.Stats.model_json_schema()["properties"].keys()
    assert "act_saved_bytes" in schemas["ModuleStats"]["properties"]  # as `sacplan schema` prints it
    document = _validator(spec, "StatsDocument")
    bodies = [e["value"] for e in upload["examples"].values()]
    bodies += [schemas[r]["examples"][0]["stats"] for r in ("PlanRequest", "SweepRequest")]
    for body in bodies + [l4_doc]:  # the examples, and PyTorch's format
        document.validate(body)
    plan = client.post("/v1/plans", json=schemas["PlanRequest"]["examples"][0]).json()
    assert not document.is_valid(plan)  # a plan is no stats document


def test_the_document_and_the_docs_show_the_package_version(client):
    import planner

    assert client.get("/openapi.json").json()["info"]["version"] == planner.PLANNER_VERSION
    health = client.get("/healthz").json()
    assert health["planner_version"] == planner.PLANNER_VERSION and health["service_version"]


def test_the_root_redirects_to_the_docs(client):
    r = client.get("/", follow_redirects=False)
    assert r.status_code in (302, 307) and r.headers["location"] == "/docs"


def _pipeline_without_times(answer: dict) -> dict:
    """As ``_without_times``, each stage's plan without its times too."""
    stages = [{k: v for k, v in p.items() if k not in ("created_at", "solve_seconds")} for p in answer["stages"]]
    return _without_times({**answer, "stages": stages})


def test_the_pipeline_example_is_what_the_service_answers(client):
    """The pipeline plan's request example is its fields' (ids of the example stages); uploaded, they answer it."""
    from service.examples import EXAMPLE_PIPELINE_STATS

    spec = client.get("/openapi.json").json()
    fields = spec["components"]["schemas"]["PipelinePlanRequest"]["properties"]
    answers = spec["paths"]["/v1/pipeline-plans"]["post"]["responses"]
    ids = [client.post("/v1/stats", json=doc).json()["id"] for doc in EXAMPLE_PIPELINE_STATS]
    assert len(fields["stats_ids"]["examples"][0]) == len(ids)
    body = {"stats_ids": ids, "memory_budget_gib": fields["memory_budget_gib"]["examples"][0]}
    made = client.post("/v1/pipeline-plans", json=body)
    assert made.status_code == 201, made.text
    assert made.json()["status"] == "optimal" and all(p["modules"] for p in made.json()["stages"])
    assert _pipeline_without_times(made.json()) == _pipeline_without_times(answers["201"]["content"]["application/json"]["example"])
    again = client.post("/v1/pipeline-plans", json=body)
    assert _pipeline_without_times(again.json()) == _pipeline_without_times(answers["200"]["content"]["application/json"]["example"])
    read = spec["paths"]["/v1/pipeline-plans/{pipeline_plan_id}"]["get"]["responses"]["200"]
    assert _pipeline_without_times(client.get(f"/v1/pipeline-plans/{made.json()['id']}").json()) == _pipeline_without_times(
        read["content"]["application/json"]["example"])

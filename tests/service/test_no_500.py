"""No 500s for text the databases cannot store or for deep module trees, on SQLite and PostgreSQL alike;
and every error leaves the connection usable or closes it properly."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

import pytest
import uvicorn
from live_server import free_port, read_answer

from service.main import create_app

NUL = "\x00"


@pytest.mark.parametrize(("params", "field"), [({"model_name": NUL}, "model_name"), ({"tag": "a" + NUL}, "tag"),
                                               ({"tag": "team=" + NUL}, "tag"),
                                               ({"model_name": "m", "tag": NUL + "x"}, "tag")])
def test_nul_in_a_query_is_422_naming_it(client, example_id, params, field):
    # Issue 19: on PostgreSQL these were 500 DataError ("A string literal cannot contain NUL").
    r = client.get("/v1/stats", params=params)
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["detail"].startswith(f"query.{field} contains a NUL character (U+0000) at character ")
    assert body["errors"][0]["loc"] == ["query", field] and body["errors"][0]["input"] == params[field]
    assert client.get("/v1/stats", params={"model_name": "two-layer-mlp"}).json()["total"] == 1  # still serving


def _with_metadata(doc: dict, **metadata) -> dict:
    doc = json.loads(json.dumps(doc))
    doc["metadata"].update(metadata)
    return doc


@pytest.mark.parametrize(("metadata", "loc"), [
    ({"model_name": "llama" + NUL}, ["metadata", "model_name"]),
    ({"tags": {"team" + NUL: "demo"}}, ["metadata", "tags", "team" + NUL]),
    ({"tags": {"team": NUL}}, ["metadata", "tags", "team"]),
])
def test_nul_in_uploaded_text_is_422_naming_the_field(client, example_doc, count_rows, metadata, loc):
    doc = _with_metadata(example_doc, **metadata)
    r = client.post("/v1/stats", json=doc)
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["loc"] == loc and "NUL character" in r.json()["detail"]
    inline = client.post("/v1/plans", json={"stats": doc, "memory_budget_gib": 5.0})
    assert inline.status_code == 422 and inline.json()["errors"][0]["loc"] == ["body", "stats", *loc]
    assert count_rows() == {"stats": 0, "stats_tags": 0, "plans": 0, "sweeps": 0}


def test_lone_surrogates_are_422_too(client, example_doc):
    r = client.post("/v1/stats", content=json.dumps(_with_metadata(example_doc, model_name="x\ud800")),
                    headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["metadata", "model_name"], r.text


def deep_stats(depth: int) -> dict:
    """A chain of ``depth`` modules, each the only child of the one before (fqns m, m.c, m.c.c, ...).

    Module names are at most 1024 characters (planner/stats/format.py), so 512 is
    the deepest tree the format allows.
    """
    fqns = ["m"]
    for _ in range(depth - 1):
        fqns.append(fqns[-1] + ".c")
    modules = [{"fqn": f, "parent": fqns[i - 1] if i else None, "is_leaf": i == depth - 1, "param_bytes": 0,
                "grad_bytes": 0, "act_saved_bytes": 1024, "act_total_bytes": 1024, "act_grad_bytes": 0,
                "grad_total_bytes": 0, "input_bytes": 0, "output_bytes": 1024, "fw_ms": 1.0, "bw_ms": 2.0}
               for i, f in enumerate(fqns)]
    return {"format": "sacplan.stats/v1",
            "metadata": {"model_name": f"deep-{depth}", "batch_size": 1, "seq_len": 1, "dtype": "fp32",
                         "device": "cpu"},
            "fw_pre_order": fqns, "fw_post_order": fqns[::-1], "modules": modules}


@pytest.mark.parametrize("depth", [300, 512])
def test_deep_module_trees_read_back(client, depth):
    # Issue 19: 255+ levels were stored, then GET answered 500 ("Maximum serialization depth exceeded").
    r = client.post("/v1/stats", json=deep_stats(depth))
    assert r.status_code == 201, r.text
    got = client.get(f"/v1/stats/{r.json()['id']}")
    assert got.status_code == 200
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * depth + 200))  # Python's own JSON reader recurses per level
    try:
        node = json.loads(got.content)["module_tree"]
    finally:
        sys.setrecursionlimit(limit)
    levels = 1
    while node["children"]:
        [node] = node["children"]
        levels += 1
    assert levels == depth and node["fqn"] == "m" + ".c" * (depth - 1) and node["is_leaf"]


@pytest.fixture
def live_app(settings):
    """The app on a real uvicorn server on 127.0.0.1, with one extra route that fails as a bug would."""
    app = create_app(settings)

    async def broken() -> dict:
        raise RuntimeError("a bug")

    app.add_api_route("/broken", broken)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    yield port
    server.should_exit = True
    thread.join(timeout=30)


def _exchange(sock: socket.socket, path: str) -> tuple[int, dict[str, str]]:
    """One keep-alive GET on ``sock``: the status and headers (the body read by its Content-Length)."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    head, _ = read_answer(sock)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers


def test_errors_keep_the_connection_usable_and_a_500_closes_it_saying_so(live_app):
    with socket.create_connection(("127.0.0.1", live_app), timeout=30) as sock:
        answers = [_exchange(sock, p)[0] for p in ("/v1/stats/nope", "/v1/stats?model_name=%00", "/v1/stats?limit=0",
                                                   "/healthz")]
        assert answers == [404, 422, 422, 200]  # one connection throughout
        status, headers = _exchange(sock, "/broken")
        assert status == 500 and headers.get("connection") == "close"
        assert sock.recv(1) == b""  # and the server did close it

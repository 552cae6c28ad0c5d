"""Uploads over a MiB are parsed and validated in a render process: the same rows and the same answers as in-process."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path

import httpx
import pytest

from service.main import create_app
from service.store import stats_row_fields
from service.transport import LARGE_BODY_BYTES

from conftest import L4_PATH

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from synthetic import make_layers  # noqa: E402

JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def big_doc() -> dict:
    doc = make_layers(json.loads(L4_PATH.read_text()), 60)  # the L4 sample's middle block 60 times: ~1.2 MiB
    assert len(json.dumps(doc)) > LARGE_BODY_BYTES
    return doc


def test_a_large_upload_is_stored_as_the_in_process_path_stores_it(client, big_doc):
    body = json.dumps(big_doc).encode()
    first = client.post("/v1/stats", content=body, headers=JSON)
    assert first.status_code == 201, first.text
    expected = stats_row_fields(big_doc)  # what the in-process path computes for the same document
    summary = first.json()
    columns = {k: v for k, v in expected.items() if k not in ("document", "tags")}
    assert {k: summary[k] for k in columns} == columns and summary["tags"] == expected["tags"]
    detail = client.get(f"/v1/stats/{summary['id']}")
    assert detail.status_code == 200 and detail.json()["module_tree"]["fqn"] == "Transformer"
    again = client.post("/v1/stats", content=body, headers=JSON)  # same content hash: the same upload
    assert again.status_code == 200 and again.json()["id"] == summary["id"]
    plan = client.post("/v1/plans", json={"stats_id": summary["id"], "memory_budget_gib": 1000, "time_limit_s": 30})
    assert plan.status_code == 201, plan.text


def test_large_bodies_get_the_answers_small_ones_get(client, big_doc, count_rows):
    pad = " " * LARGE_BODY_BYTES  # JSON allows whitespace: the same documents, past the size

    def both(body: bytes):
        small = client.post("/v1/stats", content=body, headers=JSON)
        large = client.post("/v1/stats", content=body + pad.encode(), headers=JSON)
        return small, large

    for body in (b'{"modules": [1,, 2]}', b'[1, 2]', b'"stats"', b'{"format": "sacplan.stats/v1"}',
                 b'{"k": "\xff"}', b"[" * 100_000 + b"]" * 100_000):
        small, large = both(body)
        # (the excerpt of the text around an error differs: it shows the padding)
        assert (large.status_code, large.json()["detail"]) == (small.status_code, small.json()["detail"]), body[:40]
        assert small.status_code in (400, 422)
    broken = json.loads(json.dumps(big_doc))
    broken["module_info"]["mod_stats"][7]["fqn"] = 5
    r = client.post("/v1/stats", content=json.dumps(broken).encode(), headers=JSON)
    assert r.status_code == 422 and "fqn" in r.json()["detail"]
    assert count_rows()["stats"] == 0


def test_a_large_upload_past_a_limit_is_413(make_client, settings, big_doc):
    client = make_client(settings.model_copy(update={"max_upload_modules": 100}))
    r = client.post("/v1/stats", content=json.dumps(big_doc).encode(), headers=JSON)
    assert r.status_code == 413 and "SACPLAN_MAX_UPLOAD_MODULES" in r.json()["detail"]


def test_large_uploads_share_the_bounded_render_pool(settings, solver, big_doc):
    # One render process and no queue: while one large upload is being validated there, the next is 503.
    app = create_app(settings.model_copy(update={"render_workers": 1, "render_queue_size": 0}), solver=solver)
    body = json.dumps(big_doc).encode()
    other = json.dumps({**big_doc, "model": "another"}).encode()

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=120) as c:
            first = asyncio.ensure_future(c.post("/v1/stats", content=body, headers=JSON))
            await asyncio.sleep(0.2)  # the first is in the render process (validating takes ~0.5 s CPU here)
            second = await c.post("/v1/stats", content=other, headers=JSON)
            return await first, second

    try:
        first, second = asyncio.run(main())
    finally:
        app.state.renderer.shutdown()
    assert first.status_code == 201, first.text
    assert second.status_code == 503 and "render queue is full" in second.json()["detail"]
    assert second.headers["retry-after"]


def test_large_bodies_leave_no_temporary_files(client, big_doc, tmp_path, monkeypatch):
    # A large body and its stats' text pass to and from the render process through temporary files: whatever
    # the answer (stored, 422, an inline plan), none is left behind.
    spool = tmp_path / "spool"
    spool.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool))
    made, mkstemp = [], tempfile.mkstemp
    monkeypatch.setattr(tempfile, "mkstemp", lambda **kw: made.append(mkstemp(**kw)) or made[-1])
    body = json.dumps({**big_doc, "model": "spooled"}).encode()
    assert client.post("/v1/stats", content=body, headers=JSON).status_code == 201
    broken = json.loads(body)
    broken["module_info"]["mod_stats"][3]["act_total"] = -1
    assert client.post("/v1/stats", content=json.dumps(broken).encode(), headers=JSON).status_code == 422
    inline = b'{"memory_budget_gib": 1000, "time_limit_s": 30, "stats": ' + body + b"}"
    assert client.post("/v1/plans", content=inline, headers=JSON).status_code in (200, 201)
    spooled = [Path(path) for _, path in made if Path(path).name.startswith("sacplan-body-")]
    assert len(spooled) == 6 and {p.parent for p in spooled} == {spool}  # a body and a text each
    assert list(spool.iterdir()) == []


def test_a_large_uploads_text_is_stored_by_the_render_process_never_read_here(settings, big_doc):
    # Reading the canonical text back (tens of MB decoded) and binding it into the insert held the GIL in a thread
    # of the service process for 100-200 ms at a time, stalling its event loop (/healthz): the render process that
    # wrote the text now stores it in the same job (the write gate is a file lock), and only the row's id comes back.
    from sqlalchemy import inspect

    from service.store import make_engine, make_sessionmaker, store_stats_body
    from service.transport import UploadLimits
    from service.views import Renderer

    factory = make_sessionmaker(make_engine(settings.sqlalchemy_url))
    renderer, ran = Renderer(1, 4, 5, 0), []

    async def run(fn, *args):
        ran.append(fn.__name__)
        return await renderer.run(fn, *args)

    try:
        body = json.dumps(big_doc).encode()
        row, inserted = asyncio.run(store_stats_body(factory, run, "p", body, limits=UploadLimits.of(settings)))
        again, inserted_again = asyncio.run(store_stats_body(factory, run, "p", body, limits=UploadLimits.of(settings)))
    finally:
        renderer.shutdown()
    assert ran == ["prepare_body_job"] * 2
    assert (inserted, inserted_again, again.id) == (True, False, row.id)
    assert "document" not in inspect(row).dict  # the text never loaded in this process
    with factory() as session:
        assert session.get(type(row), row.id).document == stats_row_fields(big_doc)["document"]

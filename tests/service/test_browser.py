"""The docs in a real browser with no network: headless Chromium against a real ``sacplan serve``.

Needs Debian's Chromium (``apt-get install chromium``); skipped without it.
Every host but 127.0.0.1 is unreachable: Chromium sends everything else to a
proxy on a closed port (127.0.0.1:9). Its NetLog records every request a
page made, so the test sees a CDN request even though it fails. Screenshots
of /docs, /redoc and a plan's chart are left in the test's temporary
directory (pytest keeps the last three runs').
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

import planner

CHROMIUM = Path("/usr/bin/chromium")
OFFLINE_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=127.0.0.1",  # port 9 (discard) is closed
]
CDN_CSS = "https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui.css"  # where FastAPI's own /docs loads from
ASSETS = {"/static/docs/swagger-ui-bundle.js", "/static/docs/swagger-ui.css", "/openapi.json"}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's Chromium: apt-get install chromium"),
]


@dataclass
class Visit:
    """What headless Chromium saw at one URL: the DOM after the time budget, and the page's requests."""

    dom: str
    requests: list[str]  # URLs the page itself asked for (not Chromium's own background traffic)
    screenshot: Path


def visit(url: str, out_dir: Path, name: str, *, budget_ms: int = 15_000) -> Visit:
    """Load ``url`` in a fresh offline Chromium profile; screenshot to ``out_dir/name.png``."""
    screenshot, netlog = out_dir / f"{name}.png", out_dir / f"{name}-netlog.json"
    cmd = [str(CHROMIUM), *OFFLINE_FLAGS, f"--user-data-dir={out_dir / f'{name}-profile'}",
           f"--log-net-log={netlog}", f"--virtual-time-budget={budget_ms}", "--window-size=1280,2000",
           f"--screenshot={screenshot}", "--dump-dom", url]
    # Its own process group, so a hung browser goes with all its helper processes.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        dom, errors = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError(f"chromium did not finish loading {url}") from None
    assert proc.returncode == 0, errors[-3000:]
    return Visit(dom, page_requests(netlog, url), screenshot)


def page_requests(netlog: Path, url: str) -> list[str]:
    """The URLs requested by the page at ``url``: its own load, and every request it initiated."""
    log = json.loads(netlog.read_text())
    start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    parts = urlsplit(url)
    origin = f"{parts.scheme}://{parts.netloc}"
    found = []
    for event in log["events"]:
        params = event.get("params") or {}
        if event["type"] == start_job and "url" in params:
            if params["url"] == url or params.get("initiator") == origin:
                found.append(params["url"])
    return found


def paths_on(server_url: str, requests: list[str]) -> set[str]:
    """The paths requested from the server; fails on a request to any other host."""
    elsewhere = [u for u in requests if not u.startswith(server_url + "/")]
    assert elsewhere == [], f"the page asked another host: {elsewhere}"
    return {urlsplit(u).path for u in requests}


def operations(spec: dict) -> list[tuple[str, str]]:
    """(first tag, operationId) of every operation in the OpenAPI document."""
    return [(op["tags"][0], op["operationId"]) for item in spec["paths"].values() for op in item.values()]


def test_docs_render_offline_and_the_flow_runs(server, example_doc, assert_png, tmp_path):
    out = tmp_path / "browser"
    out.mkdir()
    server.start()

    # The sandbox really is offline: what FastAPI's default /docs needs does not load.
    control = visit(CDN_CSS, out, "cdn-control", budget_ms=5_000)
    assert ".swagger-ui" not in control.dom and control.requests == [CDN_CSS]

    spec = httpx.get(server.url + "/openapi.json").json()
    ops = operations(spec)
    assert len(ops) >= 10

    docs = visit(server.url + "/docs", out, "docs")
    assert "Failed to load API definition" not in docs.dom
    assert 'class="title">sacplan' in docs.dom  # the title Swagger UI renders from info
    assert f"> {planner.PLANNER_VERSION} <" in docs.dom  # the version badge: the package's
    missing = [op for op in ops if f'id="operations-{op[0]}-{op[1]}"' not in docs.dom]
    assert missing == [], f"Swagger UI did not render {missing}"
    assert ASSETS | {"/docs"} <= paths_on(server.url, docs.requests)

    redoc = visit(server.url + "/redoc", out, "redoc")
    missing = [op for op in ops if f'data-section-id="operation/{op[1]}"' not in redoc.dom]
    assert missing == [], f"ReDoc did not render {missing}"
    # The stats upload's fields, from the stats v1 schema (their descriptions are in no example).
    assert "Module fqns in forward pre-order (root first)." in redoc.dom
    assert {"/static/docs/redoc.standalone.js", "/openapi.json"} <= paths_on(server.url, redoc.requests)

    # The three steps the docs describe: stats -> plan -> chart.
    with httpx.Client(base_url=server.url, timeout=120) as c:
        stats = c.post("/v1/stats", json=example_doc)
        assert stats.status_code == 201, stats.text
        plan = c.post("/v1/plans", json={"stats_id": stats.json()["id"], "memory_budget_gib": 4.5})
        assert plan.status_code == 201 and plan.json()["status"] in ("optimal", "feasible"), plan.text
        chart_url = f"/v1/plans/{plan.json()['id']}/chart.png"
        chart = c.get(chart_url)
        assert chart.status_code == 200 and chart.headers["content-type"] == "image/png"
        assert_png(chart.content)
    shown = visit(server.url + chart_url, out, "chart", budget_ms=5_000)
    assert paths_on(server.url, shown.requests) >= {chart_url}

    for page in (docs, redoc, shown):
        assert_png(page.screenshot.read_bytes())

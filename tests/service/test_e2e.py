"""End to end: a real ``sacplan serve`` on 127.0.0.1, restarted over the same data dir."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED_L4 = REPO.parent / "shared" / "reference" / "torch_format_transformer_L4.json"
L4_PATH = REPO / "tests" / "data" / "torch_format_transformer_L4.json"

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command() -> list[str]:
    exe = shutil.which("sacplan")
    return [exe] if exe else [sys.executable, "-m", "planner.cli"]


class Server:
    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log = data_dir / "server.log"

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SACPLAN_")}
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        cmd = _command() + ["serve", "--host", "127.0.0.1", "--port", str(self.port),
                            "--data-dir", str(self.data_dir)]
        # Its own process group: a signal to the group (a terminal's Ctrl-C) reaches only it and its workers.
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self.log.open("ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError("server did not become ready:\n" + self.log.read_text()[-3000:])

    def stop(self, sig: signal.Signals = signal.SIGINT, *, group: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            if group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


    def wait_group_gone(self, timeout_s: float = 30) -> None:
        """Wait until every process of the server's group (workers, resource tracker) has exited."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        raise AssertionError("the server's processes did not exit")


@pytest.fixture
def server(tmp_path):
    srv = Server(tmp_path / "data")
    srv.data_dir.mkdir()
    yield srv
    srv.stop()


def test_serve_upload_plan_cache_chart_restart(server, assert_png):
    server.start()
    doc = json.loads((SHARED_L4 if SHARED_L4.exists() else L4_PATH).read_text())
    with httpx.Client(base_url=server.url, timeout=120) as c:
        up = c.post("/v1/stats", json=doc)
        assert up.status_code == 201, up.text
        stats_id = up.json()["id"]

        plans = {}
        for budget in (4.0, 5.0, 6.0):
            r = c.post("/v1/plans", json={"stats_id": stats_id, "memory_budget_gib": budget, "time_limit_s": 60})
            assert r.status_code == 200, r.text
            assert r.json()["cached"] is False
            assert r.json()["status"] in ("optimal", "feasible"), r.json()["message"]
            assert r.json()["peak_bytes"] <= budget * 2**30
            plans[budget] = r.json()
        solves = c.get("/healthz").json()["solver"]["solves_started"]
        assert solves == 3

        again = c.post("/v1/plans", json={"stats_id": stats_id, "memory_budget_gib": 5.0, "time_limit_s": 60})
        assert again.json()["cached"] is True and again.json()["id"] == plans[5.0]["id"]
        assert c.get("/healthz").json()["solver"]["solves_started"] == solves
        assert c.get(f"/v1/stats/{stats_id}/plans").json()["total"] == 3

        chart = c.get(f"/v1/plans/{plans[4.0]['id']}/chart.png")
        assert chart.status_code == 200 and chart.headers["content-type"] == "image/png"
        assert_png(chart.content)

    assert (server.data_dir / "sacplan.db").exists()
    server.stop()
    server.start()
    with httpx.Client(base_url=server.url, timeout=120) as c:
        assert c.get(f"/v1/stats/{stats_id}").json()["content_hash"] == up.json()["content_hash"]
        assert c.post("/v1/stats", json=doc).status_code == 200  # known after the restart
        r = c.post("/v1/plans", json={"stats_id": stats_id, "memory_budget_gib": 6.0, "time_limit_s": 60})
        assert r.json()["cached"] is True and r.json()["id"] == plans[6.0]["id"]
        assert c.get("/healthz").json()["solver"]["solves_started"] == 0  # a fresh process solved nothing
        assert c.get(f"/v1/plans/{plans[4.0]['id']}").json()["recompute_ms"] == plans[4.0]["recompute_ms"]


@pytest.mark.parametrize(("sig", "group"), [(signal.SIGINT, True), (signal.SIGTERM, False), (signal.SIGTERM, True)],
                         ids=["ctrl-c", "sigterm", "sigterm-to-group"])
def test_stale_stats_and_stopping_leave_a_clean_log(server, example_doc, store_as_older_planner, sig, group):
    """A 409 on one keep-alive connection, no exception reaching uvicorn; stopping releases the solver pool."""
    server.start()
    url = f"sqlite:///{server.data_dir / 'sacplan.db'}"
    stale = store_as_older_planner(url, lambda doc: doc["modules"][2].update(parent="Net"))
    with httpx.Client(base_url=server.url, timeout=120) as c:
        good = c.post("/v1/stats", json=example_doc).json()["id"]
        assert c.post("/v1/plans", json={"stats_id": good, "memory_budget_gib": 4.5}).status_code == 200
        answers = [c.get(f"/v1/stats/{stale}"), c.post("/v1/plans", json={"stats_id": stale, "memory_budget_gib": 4.5}),
                   c.post("/v1/sweeps", json={"stats_id": stale, "budgets_gib": [4.0, 5.0]})]
        assert [r.status_code for r in answers] == [409, 409, 409], [r.text for r in answers]
        assert c.get("/v1/stats").json()["total"] == 2  # the same connection, still open
    server.stop(sig, group=group)
    assert server.proc.returncode in (0, -sig), server.proc.returncode
    server.wait_group_gone()  # multiprocessing's resource tracker writes its leak warning as it exits
    log = server.log.read_text()
    assert "Exception in ASGI application" not in log and "Traceback" not in log, log[-3000:]
    assert "leaked semaphore" not in log, log[-3000:]
    assert "Application shutdown complete" in log

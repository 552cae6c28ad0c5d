"""A real ``sacplan serve`` on 127.0.0.1 in its own process group, for the end-to-end and browser tests."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """Exactly one HTTP response from ``sock``: its head (status line and headers) and its Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a whole answer: {data[:300]!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed in the body"
        body += chunk
    return head, body


def serve_command() -> list[str]:
    exe = shutil.which("sacplan")
    return [exe] if exe else [sys.executable, "-m", "planner.cli"]


class Server:
    """``sacplan serve`` over ``data_dir`` (or ``database_url``), its output in ``data_dir/server.log``."""

    def __init__(self, data_dir: Path, *, database_url: str | None = None, env: dict[str, str] | None = None,
                 workers: int = 1):
        self.data_dir = data_dir
        self.database_url = database_url
        self.extra_env = dict(env or {})
        self.workers = workers
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log = data_dir / "server.log"

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SACPLAN_")}
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        if self.database_url:
            env["SACPLAN_DATABASE_URL"] = self.database_url
        env.update(self.extra_env)
        cmd = serve_command() + ["serve", "--host", "127.0.0.1", "--port", str(self.port),
                                 "--data-dir", str(self.data_dir), "--workers", str(self.workers)]
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

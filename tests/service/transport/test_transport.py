"""Transport and process hygiene of a real ``sacplan serve``: deadlines for unfinished requests, proxy trust,
no secrets in the log, no solver process outliving the server."""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import time

import httpx
import pytest
from live_server import Server

from service.transport import RedactSecrets

KEY = "transport-key-0123456789abcdef"
# Short deadlines so the tests wait little; the socket timeout is the bound past which the server failed.
FAST = {"SACPLAN_HEADER_TIMEOUT_S": "1", "SACPLAN_BODY_TIMEOUT_S": "1", "SACPLAN_KEEP_ALIVE_TIMEOUT_S": "1"}
FAILED_AFTER_S = 30


def _serve(tmp_path, **env) -> Server:
    server = Server(tmp_path / "data", env=env)
    server.data_dir.mkdir(parents=True)
    server.start()
    return server


@pytest.fixture
def fast_server(tmp_path):
    server = _serve(tmp_path, **FAST)
    yield server
    server.stop()


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes; fails if it keeps the connection past FAILED_AFTER_S."""
    sock.settimeout(FAILED_AFTER_S)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _connect(server: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=FAILED_AFTER_S)


def test_unfinished_headers_are_408_and_closed(fast_server):
    with _connect(fast_server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # no blank line: headers never end
        answer = _read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 ") and b"request headers did not arrive within 1 s" in answer


def test_trickled_headers_do_not_keep_a_connection(fast_server):
    # Every byte used to reset uvicorn's only timer: a client sending one now and then was never closed.
    answer = b""
    with _connect(fast_server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        deadline = time.monotonic() + FAILED_AFTER_S
        while time.monotonic() < deadline:
            readable, _, _ = select.select([sock], [], [], 0.25)
            if readable:
                answer = _read_until_closed(sock)
                break
            sock.sendall(b"X")  # a byte of a header line, four times a second
    assert answer.startswith(b"HTTP/1.1 408 ")


def test_unfinished_body_is_408_and_closed(fast_server):
    with _connect(fast_server) as sock:
        sock.sendall(b"POST /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                     b"content-length: 100\r\n\r\n{\"format\":")
        answer = _read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 ") and b"request body did not arrive within 1 s" in answer


def test_idle_connections_are_closed_and_finished_requests_unaffected(fast_server):
    with _connect(fast_server) as sock:  # connected, never sent anything
        assert _read_until_closed(sock).startswith(b"HTTP/1.1 408 ")
    with httpx.Client(base_url=fast_server.url) as client:  # whole requests are answered as ever
        assert client.get("/healthz").status_code == 200
        assert client.post("/v1/stats", json={}).status_code == 422


def test_forwarded_for_believed_only_from_trusted_proxies(tmp_path):
    headers = {"X-Forwarded-For": "203.0.113.7"}
    untrusted = _serve(tmp_path / "a")
    try:
        httpx.get(untrusted.url + "/healthz", headers=headers)
    finally:
        untrusted.stop()
    log = untrusted.log.read_text()
    assert "127.0.0.1:" in log and "203.0.113.7" not in log, log[-2000:]
    trusted = _serve(tmp_path / "b", SACPLAN_TRUSTED_PROXIES="127.0.0.1")
    try:
        httpx.get(trusted.url + "/healthz", headers=headers)
    finally:
        trusted.stop()
    assert "203.0.113.7" in trusted.log.read_text()


def test_keys_never_reach_the_log(tmp_path):
    # At trace level uvicorn also writes each ASGI scope, query string included (headers it hides itself).
    server = _serve(tmp_path, SACPLAN_API_KEYS=f'{{"{KEY}": "alpha"}}', SACPLAN_LOG_LEVEL="trace")
    try:
        auth = {"Authorization": f"Bearer {KEY}"}
        assert httpx.get(f"{server.url}/v1/stats?api_key={KEY}&limit=5", headers=auth).status_code == 200
        assert httpx.get(f"{server.url}/v1/stats?token=abc123&limit=5", headers=auth).status_code == 200
        assert httpx.get(f"{server.url}/v1/stats/{KEY}", headers=auth).status_code == 404
    finally:
        server.stop()
    log = server.log.read_text()
    assert KEY not in log and "abc123" not in log, log[-3000:]
    assert "api_key=***&limit=5" in log and "/v1/stats/***" in log  # the requests are still logged
    assert "'query_string': b'api_key=***&limit=5'" in log  # and so are the scopes, their keys hidden


def test_redaction_of_log_records():
    redact = RedactSecrets(["s3cret-key"])
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s"', ("1.2.3.4", "GET",
                               "/x?Authorization=Bearer%20abc&password=pw&q=s3cret-key&ok=1"), None)
    redact.filter(record)
    assert record.getMessage() == '1.2.3.4 - "GET /x?Authorization=***&password=***&q=***&ok=1"'
    scope = {"headers": [(b"authorization", b"Bearer typo-of-a-key")], "path": "/v1/stats"}
    record = logging.LogRecord("uvicorn.asgi", 5, __file__, 1, "ASGI [%d] Started scope=%s", (1, scope), None)
    redact.filter(record)
    assert "typo-of-a-key" not in record.getMessage() and "Bearer ***" in record.getMessage()


def _children(pid: int) -> list[int]:
    """Every process whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def test_solver_processes_die_with_the_server(server):
    server.start()  # the solver pool is started with the server: its worker and resource tracker run now
    children = _children(server.proc.pid)
    assert len(children) >= 2, children  # the solver process and multiprocessing's resource tracker
    server.proc.send_signal(signal.SIGKILL)  # the server only: no chance to stop its pool
    server.proc.wait()
    server.wait_group_gone(timeout_s=FAILED_AFTER_S)  # nothing of its group is left

"""Ambiguous framing is 400 and the connection closed (RFC 9112 sections 6.1 and 6.3), on a real ``sacplan serve``
spoken to in raw HTTP over a socket, on SQLite and PostgreSQL.

Issue 33: a POST with both ``Transfer-Encoding: chunked`` and ``Content-Length`` was read by its chunks and the
connection kept: a ``GET /healthz`` smuggled after the chunked body was answered on the same connection. A proxy in
front that framed the request by its Content-Length would have sent that GET as part of the body.
"""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from service.examples import EXAMPLE_STATS
from service.transport import ambiguous_framing

FAILED_AFTER_S = 30
BODY = json.dumps(EXAMPLE_STATS).encode()
CHUNKED = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
SMUGGLED = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
HEAD = b"POST /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"

AMBIGUOUS = {
    "chunked and a length": HEAD + b"Transfer-Encoding: chunked\r\nContent-Length: %d\r\n\r\n" % len(CHUNKED) + CHUNKED,
    "a length and chunked": HEAD + b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % len(CHUNKED) + CHUNKED,
    "the same length twice": HEAD + b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(BODY), len(BODY)) + BODY,
    "a list of one length": HEAD + b"Content-Length: %d, %d\r\n\r\n" % (len(BODY), len(BODY)) + BODY,
    "two lengths": HEAD + b"Content-Length: %d\r\nContent-Length: 5\r\n\r\n" % len(BODY) + BODY,
    "a chunk size in hex notation": HEAD + b"Transfer-Encoding: chunked\r\n\r\n0x%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY),
    "a signed chunk size": HEAD + b"Transfer-Encoding: chunked\r\n\r\n+%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY),
    "a chunk size past any length": HEAD + b"Transfer-Encoding: chunked\r\n\r\n%s\r\n%s\r\n0\r\n\r\n" % (b"f" * 40, BODY),
    "a chunk without its CRLF": HEAD + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%sXX0\r\n\r\n" % (len(BODY), BODY),
}


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes; fails (socket timeout) if it keeps the connection open."""
    sock.settimeout(FAILED_AFTER_S)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


@pytest.fixture(params=["sqlite", "postgresql"])
def live(request):
    server = request.getfixturevalue("server" if request.param == "sqlite" else "pg_server")
    server.start()
    return server


def test_ambiguous_framing_is_400_and_closed_and_nothing_smuggled(live):
    for name, request in AMBIGUOUS.items():
        with socket.create_connection(("127.0.0.1", live.port), timeout=FAILED_AFTER_S) as sock:
            sock.sendall(request + SMUGGLED)
            answer = _read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 400 "), (name, answer[:300])
        assert answer.count(b"HTTP/1.1 ") == 1, (name, answer)  # the smuggled GET was never answered
        assert b"connection: close" in answer.lower(), name
    assert httpx.get(f"{live.url}/v1/stats", timeout=30).json()["total"] == 0  # no body was taken as an upload


def test_plain_framing_still_keeps_the_connection(live):
    # The control: the same upload framed one way (by length, then by chunks), then the GET on the same connection.
    for framing in (b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY), b"Transfer-Encoding: chunked\r\n\r\n" + CHUNKED):
        with socket.create_connection(("127.0.0.1", live.port), timeout=FAILED_AFTER_S) as sock:
            sock.sendall(HEAD + framing + SMUGGLED.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
            answer = _read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 20") and answer.count(b"HTTP/1.1 ") == 2, answer[:300]
        assert answer.rindex(b"HTTP/1.1 200 OK") > answer.rindex(b'"content_hash"')  # the GET, answered second
        assert answer.endswith(b'"status":"ok"') or b'"status":"ok"' in answer[answer.rindex(b"HTTP/1.1 "):]


@pytest.mark.parametrize(("head", "problem"), [
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\ncontent-length: 3", "both Transfer-Encoding and Content-Length"),
    (b"POST / HTTP/1.1\r\nContent-Length: 3\r\nCONTENT-LENGTH: 3", "Content-Length more than once"),
    (b"POST / HTTP/1.1\nContent-Length: 3,3", "Content-Length is a list"),
    (b"POST / HTTP/1.1\r\nContent-Length: 3\r\nX-Note: a\r\n Content-Length: 4", None),  # a folded value, no header
    (b"POST / HTTP/1.1\r\nContent-Length: 3", None),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked", None),
])
def test_what_is_ambiguous(head, problem):
    found = ambiguous_framing(head)
    assert (found is None) if problem is None else (problem in found)

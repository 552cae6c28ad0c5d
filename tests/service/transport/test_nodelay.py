"""Answers leave at once: TCP_NODELAY on every accepted connection, ``--workers N`` included.

A response is written in two pieces (headers, then body). With Nagle's algorithm
on, the body waits for the client's ACK of the headers, which Linux delays by at
least 40 ms (``TCP_DELACK_MIN``) once a connection is interactive: every
keep-alive request after the first took 44 ms (bench/RESULTS.md, "## Service
load"). asyncio turns Nagle off only when the listening socket says
``IPPROTO_TCP``, and the one uvicorn binds itself for ``--workers N`` says 0
(uvicorn issue 3149).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import uvicorn
from live_server import Server, read_answer
from two_layer_stats import TWO_LAYER_STATS

from service.config import Settings
from service.transport import uvicorn_options

BODY = b'{"ok":true}'


async def _tiny_app(scope, receive, send) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(BODY))]})
    await send({"type": "http.response.body", "body": BODY})


def _exchange(sock: socket.socket, request: bytes) -> bytes:
    """Send ``request`` in one write; read exactly one response."""
    sock.sendall(request)
    head, body = read_answer(sock)
    return head + b"\r\n\r\n" + body


def test_nodelay_on_connections_accepted_from_a_listener_uvicorn_bound():
    config = uvicorn.Config(_tiny_app, host="127.0.0.1", port=0, lifespan="off", log_level="warning",
                            **uvicorn_options(Settings()))
    listener = config.bind_socket()  # what the --workers N supervisor hands every worker
    server = uvicorn.Server(config)
    thread = threading.Thread(target=asyncio.run, args=(server.serve(sockets=[listener]),), daemon=True)
    thread.start()
    try:
        for _ in range(300):
            if server.started:
                break
            time.sleep(0.05)
        assert server.started
        with socket.create_connection(listener.getsockname()[:2], timeout=30) as client:
            answer = _exchange(client, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(BODY)
            accepted = [c.transport.get_extra_info("socket") for c in server.server_state.connections]
            assert len(accepted) == 1
            assert accepted[0].getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        listener.close()


def test_keep_alive_uploads_are_not_held_for_a_delayed_ack(tmp_path):
    # End to end through `sacplan serve --workers 2`. With the delay, every request after the second one
    # waits for a delayed ACK, at least 40 ms (Linux's TCP_DELACK_MIN) however idle the machine: 43.9 ms for
    # the fastest of these 20 uploads before the fix. Without it a small upload takes a few ms of CPU. Only the
    # fastest of 20 is compared, against 35 ms: a loaded machine would have to slow every one of them
    # tenfold to fail it, and no speed of the machine makes one pass with the delay.
    server = Server(tmp_path / "data", workers=2)
    server.data_dir.mkdir()
    server.start()
    try:
        took_ms = []
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as client:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for i in range(22):
                doc = json.loads(json.dumps(TWO_LAYER_STATS))
                doc["metadata"]["tags"] = {"nodelay": str(i)}
                body = json.dumps(doc).encode()
                request = (b"POST /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                t0 = time.perf_counter()
                answer = _exchange(client, request)
                took_ms.append((time.perf_counter() - t0) * 1000)
                assert answer.startswith(b"HTTP/1.1 201 "), answer[:300]
        assert min(took_ms[2:]) < 35, f"every keep-alive upload waited: {[round(t, 1) for t in took_ms]} ms"
    finally:
        server.stop()

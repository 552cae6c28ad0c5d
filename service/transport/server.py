"""Transport hygiene for ``sacplan serve``: deadlines for unfinished requests, unambiguous framing, proxy trust,
secret-free logs.

uvicorn bounds only the idle time between two requests (``timeout_keep_alive``),
and any byte a client sends cancels even that: a client trickling a byte now
and then, or never finishing its headers or its body, held a connection (and
its memory) for ever. :class:`DeadlineH11Protocol` gives each request a
deadline for its headers (from the connection, or from the previous answer)
and one for its body (from its headers); past either the client gets
``408`` and the connection is closed. Work the service does after the request
has arrived is never cut short here. Its h11 connection refuses requests
whose framing is ambiguous (``framing.py``: 400 and the connection closed).

It also turns Nagle's algorithm off on every accepted TCP socket. asyncio does
that only when the listener says ``IPPROTO_TCP``, and the listener uvicorn
binds itself for ``--workers N`` says 0 (uvicorn issue 3149): a response goes
out in two writes (headers, then body), and the body waited for the client's
delayed ACK, 40 ms on Linux, on every keep-alive request after the first.

In production put a reverse proxy (nginx, HAProxy, a cloud load balancer) in
front anyway: it buffers slow clients and terminates TLS; then list its
address in ``SACPLAN_TRUSTED_PROXIES`` so the client address it forwards is
believed (from nobody else).
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from typing import Any

import h11
from uvicorn import Config
from uvicorn.protocols.http.h11_impl import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE, H11Protocol

from service.config import Settings, get_settings
from service.transport.framing import StrictFramingConnection

__all__ = ["DeadlineH11Protocol", "RedactSecrets", "uvicorn_options", "install_log_redaction"]

log = logging.getLogger("service.transport")

_REQUEST_TIMEOUT = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                    b"connection: close\r\ncontent-length: %d\r\n\r\n%s")


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's headers and one for its body."""

    def __init__(self, config: Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.conn = StrictFramingConnection(  # as uvicorn makes its own
            h11.SERVER, config.h11_max_incomplete_event_size or DEFAULT_MAX_INCOMPLETE_EVENT_SIZE)
        settings = get_settings()
        self.header_timeout_s = settings.header_timeout_s
        self.body_timeout_s = settings.body_timeout_s
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_for: str | None = None  # "headers", "body", or None (the request is in)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        _no_delay(transport)
        self._expect("headers")

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow_request()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._expect("headers")  # the next request's, from now; bytes of it do not reset it
            self._follow_request()  # unless a pipelined one is already in

    def connection_lost(self, exc: Exception | None) -> None:
        self._expect(None)
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        # uvicorn's answer to every malformed request; for ambiguous framing, what was ambiguous
        super().send_400_response(getattr(self.conn, "framing_problem", None) or msg)

    def _follow_request(self) -> None:
        """Move the deadline along with the request h11 is reading."""
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            if self._waiting_for != "body":
                self._expect("body")
        elif state is not h11.IDLE:  # the whole request is in (or the connection is ending)
            self._expect(None)

    def _expect(self, what: str | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._waiting_for = what
        if what is not None:
            delay = self.header_timeout_s if what == "headers" else self.body_timeout_s
            self._deadline = self.loop.call_later(delay, self._too_slow, what)

    def _too_slow(self, what: str) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        started = self.cycle is not None and self.cycle.response_started and what == "body"
        if not started:
            limit = self.header_timeout_s if what == "headers" else self.body_timeout_s
            message = f"the request {what} did not arrive within {limit:g} s".encode()
            self.transport.write(_REQUEST_TIMEOUT % (len(message), message))
        log.info("closed a connection from %s: request %s not complete in time", _peer(self.client), what)
        self.transport.close()


def _no_delay(transport: asyncio.BaseTransport) -> None:
    """Send each write at once (TCP_NODELAY), whatever the listening socket's ``proto`` was."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # the connection is already gone: nothing to send
            pass


def _peer(client: tuple[str, int] | None) -> str:
    return "%s:%d" % client if client else "?"


# Query parameters whose values are secrets, whatever a client thought it was doing.
_SECRET_PARAMS = re.compile(r"(?i)((?<![\w-])(?:api[_-]?key|key|token|access[_-]?token|auth|authorization|"
                            r"password|secret)=)[^&#\s\"']*")
# A credential in a rendered header (uvicorn's trace log writes ASGI scopes, headers included).
_CREDENTIALS = re.compile(r"(?i)\b((?:bearer|basic)\s+)[^\s'\",)]+")


class RedactSecrets(logging.Filter):
    """Rewrite log records so that no API key and no secret-looking query value reaches a log.

    The access log writes each request's path with its query string: a key sent
    as ``?api_key=...`` (or pasted anywhere in a URL) was written out as is.
    """

    def __init__(self, secrets: list[str]):
        super().__init__()
        self._secrets = re.compile("|".join(re.escape(s) for s in sorted(secrets, key=len, reverse=True))) \
            if secrets else None

    def redact(self, text: str) -> str:
        text = _CREDENTIALS.sub(r"\1***", _SECRET_PARAMS.sub(r"\1***", text))
        return self._secrets.sub("***", text) if self._secrets else text

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and all(isinstance(a, (str, int, float)) for a in args):
            # Argument by argument: uvicorn's access formatter unpacks them (client, method, path, ...).
            record.args = tuple(self.redact(a) if isinstance(a, str) else a for a in args)
            if isinstance(record.msg, str):
                record.msg = self.redact(record.msg)
            return True
        message = record.getMessage()  # anything else (a scope, a dict): redact what it renders to
        redacted = self.redact(message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        return True


def install_log_redaction(settings: Settings) -> RedactSecrets:
    """Put :class:`RedactSecrets` on the loggers requests are written to (uvicorn's and the service's)."""
    redactor = RedactSecrets([k.get_secret_value() for k, _ in settings.api_key_secrets()])
    for name in ("uvicorn.access", "uvicorn.error", "uvicorn.asgi", "service"):
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, RedactSecrets)]:
            logger.removeFilter(old)
        logger.addFilter(redactor)
    return redactor


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """The ``uvicorn.run`` options these settings ask for: the deadline protocol, keep-alive, proxy trust."""
    proxies = [p.strip() for p in settings.trusted_proxies.split(",") if p.strip()]
    return {
        "http": DeadlineH11Protocol,
        "timeout_keep_alive": settings.keep_alive_timeout_s,
        # Off unless addresses are given: uvicorn would otherwise believe 127.0.0.1 (or $FORWARDED_ALLOW_IPS).
        "proxy_headers": bool(proxies),
        "forwarded_allow_ips": proxies or None,
    }

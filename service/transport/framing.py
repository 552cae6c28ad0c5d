"""Requests whose framing is ambiguous refused before anything reads them: 400, and the connection closed.

A request that says both ``Transfer-Encoding`` and ``Content-Length``, or says
``Content-Length`` twice (or as a list), has a body whose end two readers can
find in two places: a proxy in front that believes the other header forwards
the rest as the next request (request smuggling). h11 reads such requests by
``Transfer-Encoding`` and by merging equal lengths, and uvicorn kept the
connection open: a ``GET /healthz`` sent after a chunked body that also carried
a ``Content-Length`` was answered on the same connection. RFC 9112 section 6.1
says a server "MUST close the connection after responding to such a request";
6.3 that a list or repeat of lengths is "unrecoverable" unless every recipient
agrees. Invalid chunk sizes (``0x7``, ``+7``, too long) h11 refuses itself, with
the same 400 and close.
"""

from __future__ import annotations

import re

import h11

__all__ = ["StrictFramingConnection", "ambiguous_framing"]

_END_OF_HEAD = re.compile(rb"\n\r?\n")  # as h11 finds it: bare LF line ends are read too
_MAX_HEAD = 1 << 16  # h11's default bound on an incomplete event: past it, h11 refuses the request itself


def ambiguous_framing(head: bytes) -> str | None:
    """What makes the framing of a request with header block ``head`` ambiguous, or None when nothing does."""
    names: list[bytes] = []
    lengths: list[bytes] = []
    for line in head.split(b"\n")[1:]:  # after the request line
        if not line.strip() or line[:1] in (b" ", b"\t"):  # an obsolete folded line continues the one before
            continue
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        names.append(name)
        if name == b"content-length":
            lengths.append(value.strip())
    if b"transfer-encoding" in names and lengths:
        return "the request has both Transfer-Encoding and Content-Length (RFC 9112 section 6.1)"
    if len(lengths) > 1:
        return "the request has Content-Length more than once (RFC 9112 section 6.3)"
    if lengths and b"," in lengths[0]:
        return "the request's Content-Length is a list, not one length (RFC 9112 section 6.3)"
    return None


class StrictFramingConnection(h11.Connection):
    """h11's server connection that also refuses ambiguous framing (:func:`ambiguous_framing`).

    h11 merges repeated lengths before its events show the headers, so the
    request's header block is looked at as it arrived, when h11 turns it into
    a request. The refusal is a ``RemoteProtocolError``, which uvicorn answers
    with 400 and a closed connection; ``framing_problem`` says why.
    """

    framing_problem: str | None = None

    def next_event(self):  # type: ignore[override]
        head = None
        if self.their_state is h11.IDLE:
            data, _ = self.trailing_data
            end = _END_OF_HEAD.search(data, 0, _MAX_HEAD + 2)
            head = data[:end.start()] if end else None
        event = super().next_event()
        if isinstance(event, h11.Request) and head is not None:
            problem = ambiguous_framing(head)
            if problem is not None:
                self.framing_problem = problem
                raise h11.RemoteProtocolError(problem, error_status_hint=400)
        return event

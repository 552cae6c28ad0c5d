"""Every error as one HTTP answer, ``detail`` and (always on 422) ``errors``, written in one place.

Schema errors name the field and the value as the client sent it. A body that
is not a JSON object at all (not JSON, not sent as JSON, empty, an array) gets
one error saying so in the client's terms instead of what the parser or the
schema saw (``body.38: JSON decode error``).
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from service.errors import ServiceError

__all__ = ["AsciiJSONResponse", "install_error_handlers"]

log = logging.getLogger("service")

_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
SEND_JSON = "send a JSON object with content-type: application/json"
# What FastAPI answers when reading the body raised anything but a JSON syntax error.
_FASTAPI_BODY_ERROR = "There was an error parsing the body"
_NOT_AN_OBJECT = ("dict_type", "model_attributes_type")
_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
               float: "a number", type(None): "null"}


class AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: a lone surrogate a client sent ("\\ud800",
    valid JSON, not valid UTF-8) comes back escaped instead of failing the response."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def _error(status: int, detail: str, errors: list[dict[str, Any]] | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    content: dict[str, Any] = {"detail": _clean(detail)}
    if status == 422 and not errors:  # every 422 has the same keys, schema or planner or service
        errors = [{"loc": [], "msg": detail, "input": None}]
    if errors is not None:
        content["errors"] = [_error_item(e) for e in errors]
    return AsciiJSONResponse(content, status_code=status, headers=headers)


def _error_item(e: dict[str, Any]) -> dict[str, Any]:
    """One field's error, always as loc, msg and input."""
    return {"loc": [str(x) for x in e.get("loc", ())], "msg": _clean(e.get("msg", "")),
            "input": _short(e.get("input"))}


def _clean(msg: str) -> str:
    # pydantic prefixes the message of a ValueError raised by a validator; it says nothing to a client.
    return msg.removeprefix("Value error, ")


def _short(value: Any) -> Any:
    """The offending input, small and JSON-safe (bytes, NaN and big objects included)."""
    if isinstance(value, (dict, list)):
        return f"<{type(value).__name__} of {len(value)}>"
    if isinstance(value, bool) or value is None or (isinstance(value, float) and math.isfinite(value)):
        return value
    if isinstance(value, bytes):
        value = value[:80].decode("utf-8", "replace")
    if isinstance(value, int) and value.bit_length() > 64:
        return f"<int of {value.bit_length()} bits>"
    if isinstance(value, int):
        return value
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _validation_errors(exc: RequestValidationError, content_type: str | None) -> tuple[str, list[dict[str, Any]]]:
    unreadable = _unreadable_body(exc, content_type)
    if unreadable is not None:
        return unreadable["msg"], [unreadable]
    errors = [_error_item(e) for e in exc.errors()]
    # The value as the client wrote it in JSON: true, "5" (not Python's True, '5').
    parts = [f"{'.'.join(x['loc'])}: {x['msg']} (got {json.dumps(x['input'])})" for x in errors[:5]]
    more = f"; and {len(errors) - 5} more" if len(errors) > 5 else ""
    return "; ".join(parts) + more, errors


def _unreadable_body(exc: RequestValidationError, content_type: str | None) -> dict[str, Any] | None:
    """The one error to tell when the body as a whole is no JSON object, else None (field errors follow)."""
    first = exc.errors()[0]
    if first["type"] == "json_invalid":
        where, excerpt = _json_position(exc.body, first["loc"][-1])
        reason = first["ctx"]["error"].removesuffix(" at")  # "Unterminated string starting at"
        msg = f"the request body is not valid JSON: {reason} {where}"
        return {"loc": ["body"], "msg": msg, "input": excerpt}
    if tuple(first["loc"]) != ("body",):
        return None
    if first["type"] == "missing":
        return {"loc": ["body"], "msg": f"the request body is empty: {SEND_JSON}", "input": None}
    if first["type"] in _NOT_AN_OBJECT and isinstance(first["input"], bytes):  # FastAPI read it as not JSON
        sent = f"content-type: {content_type}" if content_type else "no content-type"
        msg = f"the request body must be JSON sent with content-type: application/json; this request sent {sent}"
        return {"loc": ["header", "content-type"], "msg": msg, "input": content_type}
    if first["type"] in _NOT_AN_OBJECT:
        kind = _JSON_TYPES.get(type(first["input"]), "no object")
        return {"loc": ["body"], "msg": f"the request body must be a JSON object ({{...}}), got {kind}",
                "input": first["input"]}
    return None


def _json_position(doc: Any, pos: Any) -> tuple[str, str]:
    """Where a JSON syntax error is, as 'at line L, column C (character P)', and the text around it."""
    text = doc if isinstance(doc, str) else ""
    pos = pos if isinstance(pos, int) and 0 <= pos <= len(text) else 0
    line = text.count("\n", 0, pos) + 1
    column = pos - (text.rfind("\n", 0, pos) + 1) + 1
    where = f"at line {line}, column {column} (character {pos})"
    if pos >= len(text):
        return where + ": the body ends there", text[-40:]
    return where, text[max(0, pos - 20):pos + 20]


def _unreadable_json(exc: StarletteHTTPException) -> str | None:
    """FastAPI's 400 for a body its JSON parser failed on other than by syntax, said in the client's terms."""
    cause = exc.__cause__
    if exc.status_code != 400 or exc.detail != _FASTAPI_BODY_ERROR or cause is None:
        return None
    if isinstance(cause, RecursionError):
        return "the request body nests JSON arrays or objects too deeply to be read"
    if isinstance(cause, UnicodeDecodeError):
        return (f"the request body is not valid JSON: it is not UTF-8 text "
                f"(byte 0x{cause.object[cause.start]:02x} at offset {cause.start})")
    return f"the request body is not valid JSON: {type(cause).__name__}: {cause}"


def allowed_methods(request: Request) -> list[str]:
    """Every method some route takes at the request's path.

    Starlette's 405 names only the first route matching the path, where one path
    may be served by several routes (``GET`` and ``POST /v1/stats``).
    """
    return [method for method in _METHODS
            if any(route.matches({**request.scope, "method": method})[0] == Match.FULL
                   for route in request.app.router.routes)]


def install_error_handlers(app: FastAPI) -> None:
    """Answer every exception as JSON with ``detail`` (and ``errors`` on 422); never a bare 500 page."""

    @app.exception_handler(ServiceError)
    async def service_error(_: Request, exc: ServiceError) -> JSONResponse:
        return _error(exc.status_code, exc.message, exc.errors, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        detail, errors = _validation_errors(exc, request.headers.get("content-type"))
        return _error(422, detail, errors)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = _unreadable_json(exc) or str(exc.detail)
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(request))}
        return _error(exc.status_code, detail, headers=headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # A bug, not bad input: log it (never the headers: they may hold keys).
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        # The server drops the connection after an exception (Starlette re-raises it once answered):
        # say so, so a keep-alive client does not send its next request into a closing socket.
        return _error(500, f"internal error: {type(exc).__name__}", headers={"Connection": "close"})

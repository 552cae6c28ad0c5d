"""The OpenAPI document as Swagger UI and ReDoc show it, made once per app.

On top of what FastAPI derives from the routes: the limits that are settings
(``service.transport.limits``), the bearer security only when the service has API keys
(without keys Swagger UI shows no Authorize button and no locks), and response
examples made by the real planner (``service.docs.response_examples``), and the
stats formats wherever a stats document is sent (``service.docs.stats_schemas``).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI

from service.config import Settings
from service.docs.response_examples import as_stored, response_examples
from service.docs.stats_schemas import declare_stats_formats
from service.transport import document_limits

__all__ = ["install_openapi"]

log = logging.getLogger("service")


def install_openapi(app: FastAPI, settings: Settings) -> None:
    """Make ``app``'s OpenAPI document (built on first use) say what this service, with ``settings``, does."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()  # FastAPI's own; it keeps it as app.openapi_schema
            document_limits(schema, settings)
            if not settings.auth_enabled:
                _drop_security(schema)
            _declare_errors(schema, auth=settings.auth_enabled)
            declare_stats_formats(schema)
            _add_response_examples(schema)
        return app.openapi_schema

    app.openapi = openapi


def _operations(schema: dict[str, Any]):
    for methods in schema.get("paths", {}).values():
        yield from methods.values()


def _drop_security(schema: dict[str, Any]) -> None:
    schema.get("components", {}).pop("securitySchemes", None)
    for operation in _operations(schema):
        operation.pop("security", None)


_ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}
# Answered by the service itself before any route (service.transport.middleware, service.api.handlers).
_BODY_ERRORS = {
    "400": "The body cannot be read as JSON at all (not UTF-8: UTF-16, UTF-32 or a byte order mark; nested too "
           "deeply), a bad Content-Length, or ambiguous framing (Transfer-Encoding with Content-Length, two "
           "Content-Lengths: the connection is closed)",
    "413": "The body is larger than this service's limit (SACPLAN_MAX_BODY_BYTES), or than the memory a service "
           "process may hold for bodies (SACPLAN_BODY_MEMORY_MB)",
    "415": "A JSON content type with a charset other than UTF-8: request bodies are UTF-8 JSON (RFC 8259)",
    "503": "The service holds its share of large request bodies (SACPLAN_BODY_MEMORY_MB): retry after "
           "Retry-After seconds",
}
_BODY_BUSY = _BODY_ERRORS["503"]
_UNAUTHORIZED = "Missing or invalid API key: send 'Authorization: Bearer <key>'"
_THROTTLED = ("Too many wrong API keys from this address (SACPLAN_AUTH_FAILURES_PER_WINDOW): "
              "retry after Retry-After seconds")


def _declare_errors(schema: dict[str, Any], *, auth: bool) -> None:
    """The error answers as the service sends them (``ErrorOut``: ``detail`` a string, ``errors`` on 422).

    FastAPI declares its own 422 body (``detail`` a list), which this service never sends;
    and it knows nothing of the answers given before routing (400, 413) or of the API keys (401, and 429
    for an address throttled after failed ones).
    """
    for path, methods in schema.get("paths", {}).items():
        for operation in methods.values():
            responses = operation.setdefault("responses", {})
            if "422" in responses:
                responses["422"]["content"] = _ERROR
            if "requestBody" in operation:
                for code, description in _BODY_ERRORS.items():
                    declared = responses.setdefault(code, {"description": description, "content": _ERROR})
                    if code == "503" and declared["description"] != _BODY_BUSY:  # the route's own 503 too
                        declared["description"] += f"; or: {_BODY_BUSY}"
            if auth and path.startswith("/v1/"):
                responses.setdefault("401", {"description": _UNAUTHORIZED, "content": _ERROR})
                busy = responses.setdefault("429", {"description": _THROTTLED, "content": _ERROR})
                if busy["description"] != _THROTTLED:  # the route's own 429 (a project's solver share) too
                    busy["description"] += f"; or: {_THROTTLED}"
    components = schema.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)


def _add_response_examples(schema: dict[str, Any]) -> None:
    """Each JSON response whose model has an example shows it, instead of Swagger UI's "string" and 0."""
    try:
        examples = response_examples()
    except Exception:  # the docs must still load; tests/service/docs/test_openapi.py holds the examples to working
        log.exception("could not make the OpenAPI response examples")
        return
    for operation in _operations(schema):
        for code, response in operation.get("responses", {}).items():
            content = response.get("content", {}).get("application/json")
            model = (content or {}).get("schema", {}).get("$ref", "").rsplit("/", 1)[-1]
            if model in examples:  # 201: made now; 200: read back, or the same request again
                content["example"] = examples[model] if code == "201" else as_stored(examples[model])

"""The OpenAPI document as Swagger UI and ReDoc show it, made once per app.

On top of what FastAPI derives from the routes: the limits that are settings
(``service.limits``), the bearer security only when the service has API keys
(without keys Swagger UI shows no Authorize button and no locks), and response
examples made by the real planner (``service.response_examples``).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI

from service.config import Settings
from service.limits import document_limits
from service.response_examples import as_stored, response_examples

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


def _add_response_examples(schema: dict[str, Any]) -> None:
    """Each JSON response whose model has an example shows it, instead of Swagger UI's "string" and 0."""
    try:
        examples = response_examples()
    except Exception:  # the docs must still load; tests/service/test_openapi.py holds the examples to working
        log.exception("could not make the OpenAPI response examples")
        return
    for operation in _operations(schema):
        for code, response in operation.get("responses", {}).items():
            content = response.get("content", {}).get("application/json")
            model = (content or {}).get("schema", {}).get("$ref", "").rsplit("/", 1)[-1]
            if model in examples:  # 201: made now; 200: read back, or the same request again
                content["example"] = examples[model] if code == "201" else as_stored(examples[model])

"""Domain exceptions; ``service.main`` turns each into one HTTP answer, in one handler."""

from __future__ import annotations

from typing import Any

__all__ = [
    "ServiceError", "NotFound", "InvalidInput", "BadRequest", "UnsupportedMediaType",
    "Unauthorized", "SolverBusy", "SolverFailed", "PayloadTooLarge",
]


class ServiceError(Exception):
    """Base: an HTTP status, a message naming the field and value, optional details."""

    status_code = 400

    def __init__(self, message: str, *, errors: list[dict[str, Any]] | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.errors = errors
        self.headers = headers or {}


class NotFound(ServiceError):
    status_code = 404


class InvalidInput(ServiceError):
    status_code = 422


class BadRequest(ServiceError):
    status_code = 400


class UnsupportedMediaType(ServiceError):
    status_code = 415


class Unauthorized(ServiceError):
    status_code = 401

    def __init__(self, message: str = "missing or invalid API key: send 'Authorization: Bearer <key>'"):
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class SolverFailed(ServiceError):
    status_code = 503


class PayloadTooLarge(ServiceError):
    status_code = 413


class SolverBusy(ServiceError):
    status_code = 503

    def __init__(self, retry_after_s: int):
        super().__init__(
            f"the solver queue is full; retry in {retry_after_s} s",
            headers={"Retry-After": str(retry_after_s)},
        )

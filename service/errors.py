"""Domain exceptions; ``service.api.handlers`` turns each into one HTTP answer, in one handler."""

from __future__ import annotations

from typing import Any

from planner import PLANNER_VERSION

__all__ = [
    "ServiceError", "NotFound", "InvalidInput", "Unauthorized", "SolverBusy", "SolverFailed", "PayloadTooLarge",
    "StoredStatsInvalid", "ProjectBusy", "TooManyAuthFailures", "RenderMemoryExceeded",
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


class StoredStatsInvalid(ServiceError):
    """Stats stored by an older planner that this planner's validation rejects: 409, never a 500."""

    status_code = 409

    def __init__(self, stats_id: str, reason: str, *, errors: list[dict[str, Any]] | None = None):
        super().__init__(
            f"stats_id {stats_id} was stored by an older planner and no longer passes planner "
            f"{PLANNER_VERSION}'s validation: {reason}. Upload corrected stats (POST /v1/stats) and plan "
            f"with the new id, or delete this upload (DELETE /v1/stats/{stats_id})",
            errors=errors,
        )


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

    def __init__(self, retry_after_s: int, queue: str = "solver"):
        super().__init__(
            f"the {queue} queue is full; retry in {retry_after_s} s",
            headers={"Retry-After": str(retry_after_s)},
        )


class ProjectBusy(ServiceError):
    """One project holds its share of the solver: 429 for it, the other projects unaffected."""

    status_code = 429

    def __init__(self, project: str, share: int, retry_after_s: int):
        super().__init__(
            f"project {project!r} already has {share} solves running or waiting, its share of this service "
            f"(SACPLAN_SOLVER_PER_PROJECT={share}); retry in {retry_after_s} s",
            headers={"Retry-After": str(retry_after_s)},
        )


class TooManyAuthFailures(ServiceError):
    """Too many wrong API keys from one client address: 429 until the window passes."""

    status_code = 429

    def __init__(self, failures: int, window_s: int, retry_after_s: int):
        super().__init__(
            f"{failures} failed authentications from this address in {window_s} s "
            f"(SACPLAN_AUTH_FAILURES_PER_WINDOW); retry in {retry_after_s} s",
            headers={"Retry-After": str(retry_after_s)},
        )


class RenderMemoryExceeded(ServiceError):
    """A render job passed the render processes' memory cap and was stopped: 413 for a body too large to
    validate within it (the store says so), 503 for anything else."""

    status_code = 503

    def __init__(self, cap_mb: int, rss_bytes: int):
        self.cap_mb = cap_mb
        super().__init__(f"the job needed more than the {cap_mb} MiB a render process may use "
                         f"(SACPLAN_RENDER_MEMORY_MB; it reached {rss_bytes / 2**20:.0f} MiB) and was stopped")

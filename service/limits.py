"""The limits that are settings, not constants in the schemas: enforced on each request and
written into the OpenAPI document, so the documented maximum is the enforced one."""

from __future__ import annotations

from typing import Any

from service.config import Settings
from service.errors import InvalidInput

__all__ = ["check_time_limit", "document_limits"]


def check_time_limit(time_limit_s: float, max_time_limit_s: float) -> None:
    """Refuse (422, naming the field) a ``time_limit_s`` above the service's ``max_time_limit_s``."""
    if time_limit_s > max_time_limit_s:
        message = f"time_limit_s {time_limit_s} is above this service's maximum {max_time_limit_s}"
        raise InvalidInput(message, errors=[{"loc": ["body", "time_limit_s"], "msg": message, "input": time_limit_s}])


def document_limits(schema: dict[str, Any], settings: Settings) -> None:
    """Write the limits that are settings into the OpenAPI document ``schema``."""
    schemas = schema.get("components", {}).get("schemas", {})
    for name in ("PlanRequest", "SweepRequest"):
        field = schemas.get(name, {}).get("properties", {}).get("time_limit_s")
        if field is not None:
            field["maximum"] = settings.max_time_limit_s

"""One time format in every response: ISO 8601 in UTC, ending in ``Z`` (``2025-01-31T12:00:00.123456Z``)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated

from pydantic import AfterValidator

__all__ = ["as_utc", "iso_utc", "UtcTime"]


def as_utc(t: datetime | None) -> datetime | None:
    """``t`` in UTC: SQLite hands back naive datetimes (everything stored is UTC), PostgreSQL the session's zone."""
    if t is None:
        return None
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)


def iso_utc(t: datetime | None) -> str | None:
    """``t`` as every response writes a time: as pydantic writes a UTC datetime (``Z``, no ``+00:00``)."""
    t = as_utc(t)
    return None if t is None else t.isoformat().removesuffix("+00:00") + "Z"


# A response model's time: whatever zone it is given, it is kept (and so written) in UTC, with a Z.
UtcTime = Annotated[datetime, AfterValidator(as_utc)]

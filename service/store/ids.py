"""Opaque ids: stats, plans and sweeps are named by random UUIDs, so an id tells nothing about other uploads.

Sequential integers told every tenant how many uploads, plans and sweeps the
others had made. A version 4 UUID (122 random bits) is unguessable and says
nothing; lists are ordered by creation time instead. Ids are written in the
canonical lowercase 36-character form; any other string names nothing (404,
the same answer as an unknown id).
"""

from __future__ import annotations

import re
import uuid

__all__ = ["ID_LENGTH", "ID_PATTERN", "new_id", "is_id", "shown_id", "EXAMPLE_IDS"]

ID_LENGTH = 36
ID_PATTERN = "^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"
_ID = re.compile(ID_PATTERN[1:-1])

# Shown in the OpenAPI document's examples (fixed, so the document is the same on every start).
EXAMPLE_IDS = {
    "stats": "3f2b8c1e-9a47-4d2e-8b61-0c5d7e9f1a23",
    "plan": "7c9e6679-7425-40de-944b-e07fc1f90ae7",
    "sweep": "c1a5e0d2-4b8f-4e6a-9d3c-2f7b1e8a6d54",
    "pipeline_stage0": "5d0c4a7b-2e19-4f83-a6d5-9b8e1c3f7a40",
    "pipeline_stage1": "9e4f1b6c-7a20-4c58-b3d9-6e1a8f2c0b57",
    "pipeline_plan": "2b7d9f3a-c6e1-4a85-9f20-d4b8e6a1c379",
}


def new_id() -> str:
    """A fresh random id."""
    return str(uuid.uuid4())


def is_id(value: object) -> bool:
    """Whether ``value`` is an id in canonical form (anything else names no row)."""
    return isinstance(value, str) and len(value) == ID_LENGTH and _ID.fullmatch(value) is not None


def shown_id(value: str) -> str:
    """``value`` as an answer may repeat it: as it is up to an id's length, else only how long it was.

    A client's 100k-character "id" echoed in a 404 turned the service into an amplifier of whatever it sent.
    """
    if len(value) <= ID_LENGTH:
        return value
    return f"({len(value)} characters, longer than any id)"

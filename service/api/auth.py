"""Who is calling: the project an API key belongs to, and the address a request came from.

One decision for the routes (``deps.get_project``) and for the plan fast path
(``fastpath.PlanFastPath``), which answers before FastAPI and must let in
exactly whom the routes let in.
"""

from __future__ import annotations

import hashlib
import hmac

from service.config import Settings

__all__ = ["project_for_key", "client_address"]


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def client_address(scope) -> str:
    """The peer's address as the server saw it ("unknown" without one)."""
    client = scope.get("client")
    return client[0] if client else "unknown"


def project_for_key(settings: Settings, offered_key: str) -> str | None:
    """The project of ``offered_key``, or None when it is no key of this service."""
    offered = _digest(offered_key)
    project = None
    # Compare against every key, digests of equal length, so timing says nothing about which matched.
    for key, name in settings.api_key_secrets():
        if hmac.compare_digest(offered, _digest(key.get_secret_value())):
            project = name
    return project

"""Service settings: one pydantic-settings class, read from ``SACPLAN_*`` variables."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "get_settings", "default_data_dir", "DEFAULT_PROJECT"]

MIB = 2**20
# The project of every request when the service has no API keys.
DEFAULT_PROJECT = "default"


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/sacplan`` (``~/.local/share/sacplan``), or ``./data`` without a home."""
    xdg = os.environ.get("XDG_DATA_HOME")
    if xdg:
        return Path(xdg) / "sacplan"
    home = Path.home() if "HOME" in os.environ else None
    return home / ".local" / "share" / "sacplan" if home else Path("data")


class Settings(BaseSettings):
    """Everything the service can be told; ``SACPLAN_<NAME>`` sets ``<name>``."""

    model_config = SettingsConfigDict(env_prefix="SACPLAN_", extra="ignore")

    data_dir: Path = Field(default_factory=default_data_dir, description="Holds the SQLite file by default.")
    database_url: str | None = Field(
        None, description="Any SQLAlchemy URL (sqlite:///..., postgresql+psycopg://...); default: SQLite in data_dir."
    )
    api_keys: dict[str, str] = Field(
        default_factory=dict,
        description='JSON object key -> project name. Empty: no auth, everything in project "default".',
    )
    max_body_bytes: int = Field(64 * MIB, ge=1024, description="Larger request bodies get 413.")
    solver_workers: int = Field(1, ge=1, le=64, description="Solver processes per service process.")
    solver_queue_size: int = Field(8, ge=0, le=10_000, description="Solves waiting beyond the running ones; then 503.")
    retry_after_s: int = Field(5, ge=1, description="Retry-After sent with 503 when the solver queue is full.")
    max_time_limit_s: float = Field(600.0, gt=0, description="Upper bound on a request's time_limit_s.")
    solver_grace_s: float = Field(
        1.0, ge=0, le=60, description="A solve still running this long after its time_limit_s is stopped (its "
                                      "process killed and replaced) and answered time_limit.")
    solver_memory_mb: int = Field(
        4096, ge=256, description="Memory cap of a solver process (resident, MiB): a solve passing it is stopped "
                                  "(answered error) and its process replaced.")
    solver_idle_memory_mb: int = Field(
        1024, ge=128, description="A solver process holding more than this (MiB) after a solve is replaced.")
    solver_per_project: int = Field(
        4, ge=1, description="Solves one project may have running or waiting per service process; beyond: 429.")
    auth_failures_per_window: int = Field(
        20, ge=1, description="Failed authentications one client address may make per window; beyond: 429.")
    auth_failure_window_s: int = Field(60, ge=1, description="That window, seconds.")
    auth_failure_sync_s: float = Field(
        1.0, ge=0, description="How stale a process's view of the failures other processes and replicas recorded "
                               "may be, seconds (0: read the database on every authenticated request).")
    max_upload_modules: int = Field(200_000, ge=1, description="Modules a stats document may have (413 beyond).")
    max_upload_ops: int = Field(5_000_000, ge=1, description="Ops a stats document may have, all modules (413).")
    # The default is the deepest tree the stats format allows (names of at most 1024 characters): such trees
    # read back (service.views.bodies.module_tree_json), so only an operator who wants less sets one.
    max_upload_depth: int = Field(
        512, ge=1, description="Nesting depth of a stats document's module tree (the root is 1; 413 beyond).")
    metrics: Literal["off", "public", "key"] = Field(
        "public", description="GET /metrics: off (404), public, or key (needs SACPLAN_METRICS_KEY as a Bearer token).")
    metrics_key: SecretStr | None = Field(None, description="The token /metrics asks for when metrics is 'key'.")
    render_workers: int = Field(1, ge=1, le=16, description="Processes rendering charts and large stats "
                                                            "read-backs, and validating uploads over 1 MiB.")
    render_queue_size: int = Field(4, ge=0, description="Renders waiting beyond the running ones; then 503.")
    render_memory_mb: int = Field(
        1024, ge=256, description="Memory cap of a render process (resident, MiB): a job passing it is stopped, its "
                                  "process replaced; an upload or inline stats needing more get 413.")
    render_nice: int = Field(
        10, ge=0, le=19, description="Niceness added to render processes, so that the service's own event loop "
                                     "(/healthz, cached reads) keeps its CPU while they validate large bodies.")
    render_prestart: bool = Field(
        True, description="Start a render process with the service, and again whenever one is retired, so that no "
                          "request waits for one to start (about a second of a 2-core machine).")
    render_idle_memory_mb: int = Field(
        384, ge=128, description="Render processes holding more than this (MiB) after a job are replaced.")
    body_memory_mb: int = Field(
        256, ge=1, description="Request bodies over 1 MiB that one service process holds at once (MiB, by "
                               "Content-Length or as they stream in): past it, 503 with Retry-After.")
    chart_cache_entries: int = Field(64, ge=0, description="Chart PNGs kept in memory per process.")
    sqlite_busy_timeout_ms: int = Field(10_000, ge=0)
    plan_response_cache_entries: int = Field(
        1024, ge=0, description="Cached plan responses kept in memory per process for the fast path; 0: off."
    )
    plan_response_cache_mib: int = Field(64, ge=1, description="Memory bound of those responses, MiB.")
    log_level: str = "info"
    # Transport (service/transport/server.py): uvicorn itself bounds only the idle time between requests.
    header_timeout_s: float = Field(10.0, gt=0, description="A request's headers must arrive within this many "
                                                            "seconds (of the connection or of the last answer).")
    body_timeout_s: float = Field(120.0, gt=0, description="A request's body must arrive within this many seconds "
                                                           "of its headers.")
    keep_alive_timeout_s: float = Field(5.0, gt=0, description="An idle keep-alive connection is closed after this.")
    trusted_proxies: str = Field(
        "", description="Comma-separated addresses or networks whose X-Forwarded-For / X-Forwarded-Proto are "
                        "believed; empty: nobody's (the peer address is the client).")

    @model_validator(mode="after")
    def _metrics_key(self) -> Settings:
        if self.metrics == "key" and not (self.metrics_key and self.metrics_key.get_secret_value()):
            raise ValueError("SACPLAN_METRICS is 'key' but SACPLAN_METRICS_KEY is not set")
        return self

    @property
    def sqlalchemy_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'sacplan.db').resolve()}"

    @property
    def auth_enabled(self) -> bool:
        return bool(self.api_keys)

    def api_key_secrets(self) -> list[tuple[SecretStr, str]]:
        """(key, project) pairs, keys wrapped so they never show in logs or reprs."""
        return [(SecretStr(k), p) for k, p in self.api_keys.items()]

    def __repr_args__(self):  # keep keys out of reprs and logs
        for name, value in super().__repr_args__():
            yield (name, "**********" if name == "api_keys" and value else value)


@lru_cache
def get_settings() -> Settings:
    """Settings from the environment, read once per process."""
    return Settings()

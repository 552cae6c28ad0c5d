"""Database models (SQLAlchemy 2, typed). Pydantic schemas live in ``service.schemas``."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Float, ForeignKey, Index, Integer, MetaData, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from service.store.ids import ID_LENGTH, new_id

__all__ = ["Base", "StatsRecord", "StatsTag", "PlanRecord", "SweepRecord", "PipelinePlanRecord", "SolveClaim", "AuthFailure", "utcnow"]

# Stable constraint names, so migrations name what the models name.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def _id_column():
    """An opaque id (``service.store.ids``), made here when a row is added."""
    return mapped_column(String(ID_LENGTH), primary_key=True, default=new_id)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class StatsRecord(Base):
    """One uploaded stats document, identified within its project by its content hash."""

    __tablename__ = "stats"
    __table_args__ = (UniqueConstraint("project", "content_hash"),)

    id: Mapped[str] = _id_column()
    project: Mapped[str] = mapped_column(String(128), index=True)
    content_hash: Mapped[str] = mapped_column(String(64))
    model_name: Mapped[str] = mapped_column(String(256), index=True)
    source_format: Mapped[str] = mapped_column(String(16))
    module_count: Mapped[int] = mapped_column(Integer)
    op_count: Mapped[int] = mapped_column(Integer)
    baseline_peak_bytes: Mapped[int] = mapped_column(BigInteger)
    compute_ms: Mapped[float] = mapped_column(Float)
    document: Mapped[str] = mapped_column(Text, deferred=True)  # canonical stats v1 JSON
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    tags: Mapped[list[StatsTag]] = relationship(
        back_populates="stats", cascade="all, delete-orphan", passive_deletes=True, lazy="selectin"
    )


class StatsTag(Base):
    """A metadata tag of a stats upload, in its own table so every database can filter on it."""

    __tablename__ = "stats_tags"
    __table_args__ = (Index("ix_stats_tags_key_value", "key", "value"),)

    stats_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("stats.id", ondelete="CASCADE"),
                                          primary_key=True)
    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    value: Mapped[str] = mapped_column(String(1024))

    stats: Mapped[StatsRecord] = relationship(back_populates="tags")


class PlanRecord(Base):
    """A solved plan, cached under a key covering the stats, the request and the planner version."""

    __tablename__ = "plans"
    __table_args__ = (UniqueConstraint("stats_id", "cache_key"),)

    id: Mapped[str] = _id_column()
    stats_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("stats.id", ondelete="CASCADE"), index=True)
    cache_key: Mapped[str] = mapped_column(String(64))
    planner_version: Mapped[str] = mapped_column(String(32))
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    memory_budget_gib: Mapped[float] = mapped_column(Float)
    world_size: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    peak_bytes: Mapped[int | None] = mapped_column(BigInteger)
    recompute_ms: Mapped[float | None] = mapped_column(Float)
    solve_seconds: Mapped[float] = mapped_column(Float)
    result: Mapped[str] = mapped_column(Text)  # the Plan as JSON, served as is
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class SweepRecord(Base):
    """A list of budgets for one stats upload; each point is a cached plan."""

    __tablename__ = "sweeps"
    __table_args__ = (UniqueConstraint("stats_id", "cache_key"),)

    id: Mapped[str] = _id_column()
    stats_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("stats.id", ondelete="CASCADE"), index=True)
    cache_key: Mapped[str] = mapped_column(String(64))
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    plan_ids: Mapped[list[str]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class PipelinePlanRecord(Base):
    """Every stage of a pipeline planned under one budget: one cached plan per stage, in stage order.

    No foreign key: it names several uploads. Deleting one of them deletes its
    plans, and the bundle then reads as gone (``service.store.pipelines``).
    """

    __tablename__ = "pipeline_plans"
    __table_args__ = (UniqueConstraint("project", "cache_key"),)

    id: Mapped[str] = _id_column()
    project: Mapped[str] = mapped_column(String(128), index=True)
    cache_key: Mapped[str] = mapped_column(String(64))
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    stats_ids: Mapped[list[str]] = mapped_column(JSON)
    plan_ids: Mapped[list[str]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class SolveClaim(Base):
    """A solve under way somewhere (this process, another worker, another replica) for one set of plan keys.

    The first request to insert the row solves; identical requests wait for its
    ``outcome``. The owner keeps ``expires_at`` ahead while it works, so a claim
    of a crashed process lapses and another request takes it over.
    """

    __tablename__ = "solve_claims"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    project: Mapped[str] = mapped_column(String(128))
    owner: Mapped[str] = mapped_column(String(64))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    outcome: Mapped[str | None] = mapped_column(Text, deferred=True)  # the solver's answer as JSON, once done


class AuthFailure(Base):
    """One failed authentication from a client address, seen by any process or replica (``service.api.throttle``).

    Rows older than the throttle's window are deleted as new ones arrive.
    """

    __tablename__ = "auth_failures"
    __table_args__ = (Index("ix_auth_failures_address_failed_at", "address", "failed_at"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    address: Mapped[str] = mapped_column(String(64))
    failed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)

"""Request and response bodies of the API (pydantic); database models are in ``service.models``."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator

import planner
from planner import Plan
from service.examples import EXAMPLE_PLAN_REQUEST, EXAMPLE_SWEEP_REQUEST
from service.times import UtcTime

__all__ = [
    "ErrorOut", "HealthOut", "ReadyOut", "SolverStatsOut",
    "StatsSummary", "StatsDetail", "StatsPage", "ModuleNode",
    "PlanOptions", "StatsSource", "PlanRequest", "PlanOut", "PlanSummary", "PlanPage",
    "SweepRequest", "SweepPoint", "SweepOut",
]

# Numbers are strict: JSON true, "5" or 1.0 for an integer is refused (422 naming the field), never coerced.
# Ids are database integers (32-bit on PostgreSQL): bounded so no request overflows a column.
Id = Annotated[int, Strict(), Field(ge=1, le=2**31 - 1)]
# Budgets are positive here, so a bad one is named as the client sent it (the planner sees them sorted).
Gib = Annotated[float, Strict(), Field(gt=0.0, le=1e9, allow_inf_nan=False)]
MAX_UNITS = 100_000
MAX_SWEEP_POINTS = 64
MAX_WORLD_SIZE = 2**20


class ErrorOut(BaseModel):
    detail: str = Field(description="What was wrong, naming the field and value.")
    errors: list[dict[str, Any]] | None = Field(
        None, description="Field-by-field details, each with loc, msg and input; always present on 422."
    )


class HealthOut(BaseModel):
    """Liveness only: nothing about the service's load or its tenants (see /metrics)."""

    status: str = "ok"
    service_version: str
    planner_version: str


class ReadyOut(BaseModel):
    status: str = "ready"
    database: str = Field(description="Database backend name, e.g. sqlite or postgresql.")


# --- stats ---------------------------------------------------------------------------------------


class StatsSummary(BaseModel):
    id: int
    model_name: str
    content_hash: str = Field(description="SHA-256 of the canonical stats v1 document: its identity.")
    source_format: str = Field(description="'v1' (sacplan.stats/v1) or 'torch' (PyTorch's module_info + sac_stats).")
    module_count: int
    op_count: int
    baseline_peak_bytes: int = Field(description="Peak memory with no checkpointing (world_size 1).")
    baseline_peak_gib: float
    compute_ms: float = Field(description="Forward + backward time of the step without recomputation.")
    tags: dict[str, str]
    created_at: UtcTime


class ModuleNode(BaseModel):
    fqn: str
    is_leaf: bool
    op_count: int | None = Field(description="Forward ops recorded for SAC; null when not collected.")
    act_saved_bytes: int
    fw_ms: float
    bw_ms: float
    children: list[ModuleNode] = Field(default_factory=list)


class StatsDetail(StatsSummary):
    module_tree: ModuleNode


class StatsPage(BaseModel):
    items: list[StatsSummary]
    total: int
    limit: int
    offset: int


# --- plans ---------------------------------------------------------------------------------------


_PLANNER_FIELDS = planner.PlanOptions.model_fields
_Fqn = Annotated[str, Field(max_length=1024)]


class PlanOptions(planner.PlanOptions):
    """The planner's own options (``planner.PlanOptions``, validated there) with this service's size limits.

    ``time_limit_s`` is also bounded by the service's setting ``max_time_limit_s``:
    enforced by the routes and written into the OpenAPI document (``service.limits``).
    """

    world_size: int = Field(1, ge=1, le=MAX_WORLD_SIZE, description=_PLANNER_FIELDS["world_size"].description)
    ac_units: list[_Fqn] | None = Field(None, max_length=MAX_UNITS, description=_PLANNER_FIELDS["ac_units"].description)
    fsdp_units: list[_Fqn] | None = Field(None, max_length=MAX_UNITS,
                                          description=_PLANNER_FIELDS["fsdp_units"].description)


class StatsSource(PlanOptions):
    """The stats to plan: an upload's ``stats_id``, or the ``stats`` document itself; exactly one of the two."""

    stats_id: Id | None = Field(None, description="The id of a stats upload (what POST /v1/stats answered).")
    stats: dict[str, Any] | None = Field(
        None, description="The stats document itself (as POST /v1/stats takes it), instead of stats_id: stored as "
                          "that upload would be (the same document again is the same upload); the answer's "
                          "stats_id names it.")

    @model_validator(mode="after")
    def _one_source(self) -> StatsSource:
        if self.stats_id is not None and self.stats is not None:
            raise ValueError("give stats_id or stats, not both")
        if self.stats_id is None and self.stats is None:
            raise ValueError("give stats_id (the id of a stats upload) or stats (the stats document itself)")
        return self


class PlanRequest(StatsSource):
    """Plan one set of stats for one memory budget."""

    model_config = ConfigDict(json_schema_extra={"examples": [EXAMPLE_PLAN_REQUEST]})

    memory_budget_gib: Gib = Field(description="Peak memory allowed per rank, GiB.")


class PlanOut(Plan):
    """A plan with its id; ``cached`` says it came from the store without a solve."""

    id: int | None = Field(description="null only for status 'error' (not stored).")
    stats_id: int
    cached: bool = Field(description="True: served from the plan cache; no solver ran for this request.")
    created_at: UtcTime | None
    request: dict[str, Any] = Field(description="The normalised request fields the plan was cached under.")


class PlanSummary(BaseModel):
    id: int
    stats_id: int
    memory_budget_gib: float
    world_size: int
    status: str
    peak_bytes: int | None
    recompute_ms: float | None
    solve_seconds: float
    planner_version: str
    created_at: UtcTime


class PlanPage(BaseModel):
    items: list[PlanSummary]
    total: int
    limit: int
    offset: int


# --- sweeps --------------------------------------------------------------------------------------


class SweepRequest(StatsSource):
    """Plans at several budgets: give ``budgets_gib``, or ``from_gib``/``to_gib``/``points``."""

    model_config = ConfigDict(json_schema_extra={"examples": [EXAMPLE_SWEEP_REQUEST]})

    budgets_gib: list[Gib] | None = Field(None, min_length=1, max_length=MAX_SWEEP_POINTS)
    from_gib: Gib | None = None
    to_gib: Gib | None = None
    points: Annotated[int, Strict()] | None = Field(None, ge=2, le=MAX_SWEEP_POINTS)

    @model_validator(mode="after")
    def _one_way(self) -> SweepRequest:
        ranged = (self.from_gib, self.to_gib, self.points)
        if self.budgets_gib is not None:
            if any(v is not None for v in ranged):
                raise ValueError("give either budgets_gib or from_gib/to_gib/points, not both")
        elif any(v is None for v in ranged):
            raise ValueError("give budgets_gib, or all of from_gib, to_gib and points")
        elif self.to_gib <= self.from_gib:
            raise ValueError(f"to_gib {self.to_gib} must be above from_gib {self.from_gib}")
        return self

    def budgets(self) -> list[float]:
        """The budgets asked for, ascending and without repeats."""
        if self.budgets_gib is not None:
            return sorted(set(float(b) for b in self.budgets_gib))
        step = (self.to_gib - self.from_gib) / (self.points - 1)
        return sorted(set(round(self.from_gib + k * step, 9) for k in range(self.points)))


class SweepPoint(BaseModel):
    plan_id: int | None
    memory_budget_gib: float
    status: str
    peak_bytes: int | None
    recompute_ms: float | None
    min_feasible_budget_gib: float | None
    cached: bool


class SweepOut(BaseModel):
    id: int | None = Field(description="null only when a point failed with status 'error' (nothing stored).")
    stats_id: int
    cached: bool = Field(description="True when every point came from the plan cache.")
    created_at: UtcTime
    baseline_peak_bytes: int
    compute_ms: float
    points: list[SweepPoint]
    chart_url: str | None

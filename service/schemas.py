"""Request and response bodies of the API (pydantic); database models are in ``service.store.models``."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, field_validator, model_validator

import planner
from planner import PipelinePlan, Plan
from service.examples import (EXAMPLE_OFFLOAD_PLAN_REQUEST, EXAMPLE_OFFLOAD_SWEEP_REQUEST, EXAMPLE_PIPELINE_BUDGET_GIB,
                              EXAMPLE_PLAN_REQUEST, EXAMPLE_SWEEP_REQUEST)
from service.times import UtcTime

__all__ = [
    "ErrorOut", "HealthOut", "ReadyOut", "SolverStatsOut",
    "StatsSummary", "StatsDetail", "StatsPage", "ModuleNode",
    "PlanOptions", "StatsSource", "PlanRequest", "PlanOut", "PlanSummary", "PlanPage",
    "SweepRequest", "SweepPoint", "SweepOut",
    "PipelinePlanRequest", "PipelinePlanOut", "MAX_PIPELINE_STAGES",
]

# Numbers are strict: JSON true, "5" or 1.0 for an integer is refused (422 naming the field), never coerced.
# Ids are opaque strings (service.store.ids); one that is no id of the project's names nothing: 404, as an unknown id.
Id = Annotated[str, Strict(), Field(min_length=1, max_length=256)]
# Budgets are positive here, so a bad one is named as the client sent it (the planner sees them sorted).
Gib = Annotated[float, Strict(), Field(gt=0.0, le=1e9, allow_inf_nan=False)]
MAX_UNITS = 100_000


def _whole_number(v: Any) -> Any:
    """JSON Schema's integer: a number with no fractional part (2 and 2.0 alike); never true or "2"."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"must be a whole number, got {v!r}")
    return v


WholeNumber = Annotated[int, BeforeValidator(_whole_number)]
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
    id: str = Field(description="The upload's opaque id.")
    model_name: str
    content_hash: str = Field(description="SHA-256 of the canonical stats v1 document: its identity.")
    source_format: str = Field(description="'v1' (sacplan.stats/v1) or 'torch' (PyTorch's module_info + sac_stats).")
    module_count: int
    op_count: int
    baseline_peak_bytes: int = Field(description="Peak memory with no checkpointing (world_size 1).")
    baseline_peak_gib: float
    compute_ms: float = Field(description="Forward + backward time of the step without recomputation (of one "
                                          "micro-batch with gradient accumulation): its ops' runtimes alone "
                                          "(roofline or timed per op), no host overhead.")
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
    enforced by the routes and written into the OpenAPI document (``service.transport.limits``).
    """

    world_size: WholeNumber = Field(1, ge=1, le=MAX_WORLD_SIZE, description=_PLANNER_FIELDS["world_size"].description)
    ac_units: list[_Fqn] | None = Field(None, max_length=MAX_UNITS, description=_PLANNER_FIELDS["ac_units"].description)
    fsdp_units: list[_Fqn] | None = Field(None, max_length=MAX_UNITS,
                                          description=_PLANNER_FIELDS["fsdp_units"].description)


    @field_validator("world_size", mode="before")
    @classmethod
    def _world_size(cls, v: Any) -> Any:  # replaces the planner's: 2.0 is JSON Schema's integer 2 too
        return _whole_number(v)


def _schema_says(*, one_of: list[dict[str, Any]], examples: list[dict[str, Any]] | None = None):
    """``json_schema_extra``: which fields go together (``oneOf``), and examples; optional fields lose ``default``.

    Optional fields are not nullable: absent means "not given", and an explicit null is refused (422),
    so the document's ``oneOf`` on ``required`` says exactly what is accepted.
    """

    def extra(schema: dict[str, Any]) -> None:
        for name in {n for alt in one_of for n in _named(alt)}:
            schema["properties"][name].pop("default", None)
        schema["oneOf"] = one_of
        if examples:
            schema["examples"] = examples

    return extra


def _named(alternative: dict[str, Any]) -> list[str]:
    names = [n for part in alternative.get("allOf", ()) for n in _named(part)]
    names += alternative.get("required", ())
    for part in alternative.get("not", {}).get("anyOf", ()):
        names += part["required"]
    return names


def _only(present: list[str], absent: list[str]) -> dict[str, Any]:
    alternative: dict[str, Any] = {"required": present}
    if absent:
        alternative["not"] = {"anyOf": [{"required": [name]} for name in absent]}
    return alternative


_ONE_SOURCE = [_only(["stats_id"], ["stats"]), _only(["stats"], ["stats_id"])]


class StatsSource(PlanOptions):
    """The stats to plan: an upload's ``stats_id``, or the ``stats`` document itself; exactly one of the two."""

    model_config = ConfigDict(json_schema_extra=_schema_says(one_of=_ONE_SOURCE))

    stats_id: Id = Field(None, description="The id of a stats upload (what POST /v1/stats answered).")
    stats: dict[str, Any] = Field(
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

    model_config = ConfigDict(json_schema_extra=_schema_says(
        one_of=_ONE_SOURCE, examples=[EXAMPLE_PLAN_REQUEST, EXAMPLE_OFFLOAD_PLAN_REQUEST]))

    memory_budget_gib: Gib = Field(description="Peak memory allowed per rank, GiB.")


class PlanOut(Plan):
    """A plan with its id; ``cached`` says it came from the store without a solve."""

    id: str | None = Field(description="The plan's opaque id; null when nothing was stored: status 'error', "
                                       "or 'time_limit' (no plan found in time).")
    stats_id: str | None = Field(description="The stats upload planned. Null only when the request's inline stats "
                                             "were not validated and stored within time_limit_s (status "
                                             "'time_limit', the message says so): nothing was stored.")
    baseline_peak_bytes: int | None = Field(description="Peak memory with no checkpointing; null with stats_id.")
    compute_ms: float | None = Field(description="Forward + backward time of the step without recomputation; null "
                                                 "with stats_id.")
    cached: bool = Field(description="True: served from the plan cache; no solver ran for this request.")
    created_at: UtcTime | None
    request: dict[str, Any] = Field(description="The normalised request fields the plan was cached under.")


class PlanSummary(BaseModel):
    id: str
    stats_id: str
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

    # Exactly one source of stats, and exactly one way of giving budgets (the list, or all three of the range).
    model_config = ConfigDict(json_schema_extra=_schema_says(
        one_of=[{"allOf": [s, b]} for s in _ONE_SOURCE
                for b in (_only(["budgets_gib"], ["from_gib", "to_gib", "points"]),
                          _only(["from_gib", "to_gib", "points"], ["budgets_gib"]))],
        examples=[EXAMPLE_SWEEP_REQUEST, EXAMPLE_OFFLOAD_SWEEP_REQUEST]))

    budgets_gib: list[Gib] = Field(None, min_length=1, max_length=MAX_SWEEP_POINTS)
    from_gib: Gib = None
    to_gib: Gib = None
    points: WholeNumber = Field(None, ge=2, le=MAX_SWEEP_POINTS)

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
    plan_id: str | None
    memory_budget_gib: float
    status: str
    peak_bytes: int | None
    recompute_ms: float | None
    min_feasible_budget_gib: float | None
    cached: bool
    step_overhead_ms: float | None = Field(None, exclude_if=lambda v: v is None, description="With offload='on': "
                                           "recompute_ms + offload_stall_ms, what the plan minimises.")
    offload_stall_ms: float | None = Field(None, exclude_if=lambda v: v is None, description="With offload='on': "
                                           "what the plan's copies to and from host memory add to the step.")
    host_bytes: int | None = Field(None, exclude_if=lambda v: v is None, description="With offload='on': the "
                                   "pinned host memory the plan's offloaded outputs take per rank.")


class SweepOut(BaseModel):
    id: str | None = Field(description="The sweep's opaque id; null only when a point failed with status 'error' "
                                       "(nothing stored), or when the inline stats were not validated and "
                                       "stored within time_limit_s (then stats_id too).")
    stats_id: str | None = Field(description="The stats upload planned. Null only when the request's inline stats "
                                             "were not validated and stored within time_limit_s (every point "
                                             "'time_limit', the message says so): nothing was stored.")
    cached: bool = Field(description="True when every point came from the plan cache.")
    created_at: UtcTime | None = Field(description="When the sweep (or, when it is not stored, its stats) was "
                                                   "stored; null with stats_id.")
    baseline_peak_bytes: int | None = Field(description="Peak memory with no checkpointing; null with stats_id.")
    compute_ms: float | None = Field(description="Forward + backward time of the step without recomputation; "
                                                 "null with stats_id.")
    message: str | None = Field(None, exclude_if=lambda v: v is None,
                                description="Present only when the answer is not the sweep asked for: why.")
    points: list[SweepPoint]
    chart_url: str | None


# --- pipeline plans ------------------------------------------------------------------------------

MAX_PIPELINE_STAGES = 256
# service.store.ids.EXAMPLE_IDS of the example stages (service.examples.EXAMPLE_PIPELINE_STATS)
_EXAMPLE_STAGE_IDS = ["5d0c4a7b-2e19-4f83-a6d5-9b8e1c3f7a40", "9e4f1b6c-7a20-4c58-b3d9-6e1a8f2c0b57"]


class PipelinePlanRequest(PlanOptions):
    """Plan every stage of a pipeline under one budget per device: the stats uploads of stages 0..S-1 of one
    collection (``sacplan collect --pp-stages S``: its ``s.stage0.json``, ``s.stage1.json``, ...)."""

    stats_ids: list[Id] = Field(
        min_length=1, max_length=MAX_PIPELINE_STAGES, examples=[_EXAMPLE_STAGE_IDS],
        description="The stats uploads of every stage, in any order (the answer is in stage order): each a "
                    "pipeline stage's (metadata.pipeline), all of one pipeline (the same stages, schedule and "
                    "microbatches), each stage once.")
    memory_budget_gib: Gib = Field(description="Peak memory allowed per device (every stage), GiB.",
                                   examples=[EXAMPLE_PIPELINE_BUDGET_GIB])


class PipelinePlanOut(PipelinePlan):
    """Every stage's plan (each one a stored plan, with its id) and the pipeline's predicted step."""

    stages: list[PlanOut] = Field(description="One plan per stage, in stage order; each also at GET /v1/plans/{id}.")
    id: str | None = Field(description="The pipeline plan's opaque id; null only when a stage's status is "
                                       "'error' (nothing stored).")
    stats_ids: list[str] = Field(description="The stages' stats ids, in stage order.")
    cached: bool = Field(description="True when every stage's plan came from the plan cache.")
    created_at: UtcTime | None
    chart_url: str | None = Field(description="Every stage's peak against the budget, as a PNG.")

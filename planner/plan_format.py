"""Plan format: what the planner answers, as JSON."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["PlanStatus", "PlannedModule", "Plan"]

PlanStatus = Literal["optimal", "feasible", "infeasible", "time_limit", "error"]


class PlannedModule(BaseModel):
    """One checkpointed module and exactly which of its ops to save."""

    model_config = ConfigDict(extra="forbid")

    fqn: str
    discard_ratio: float = Field(
        description="Fraction of the module's op output bytes not kept: 1 - saved_bytes / total op bytes "
        "(PyTorch's meaning; the op-level budget is 1 - discard_ratio)."
    )
    discarded_bytes: int = Field(
        description="Activation memory freed vs. no checkpointing: autograd-saved bytes minus bytes the policy keeps."
    )
    saved_bytes: int = Field(description="Bytes of op outputs the policy keeps.")
    recompute_ms: float = Field(description="Runtime of the ops recomputed in backward.")
    save: list[int] = Field(description="1 = save, 0 = recompute, one per op of the module in the stats.")
    op_names: list[str] | None = Field(
        None, description="The module's op names, aligned with save: lets apply_plan verify the model runs the same ops."
    )


class Plan(BaseModel):
    """A checkpointing plan for one memory budget."""

    model_config = ConfigDict(extra="forbid")

    status: PlanStatus = Field(
        description="optimal: proven best within the requested mip_rel_gap (mip_gap: the proven gap); "
        "feasible: the search stopped early (time limit, or the exact DP's work limit on deep stacks of "
        "identical blocks), best plan found with its proven gap (mip_gap); "
        "infeasible: no plan fits (see min_feasible_budget_gib); time_limit: no plan found in time; "
        "error: the solver failed (see message)."
    )
    message: str = ""
    memory_budget_gib: float
    world_size: int = 1
    peak_bytes: int | None = Field(None, description="Peak memory of the plan under the memory model.")
    recompute_ms: float | None = Field(None, description="Total recompute time of the plan.")
    baseline_peak_bytes: int = Field(description="Peak memory with no checkpointing.")
    compute_ms: float = Field(description="Forward + backward time of the step without recomputation.")
    solve_seconds: float = 0.0
    mip_gap: float | None = Field(None, description="Proven relative optimality gap (at most the requested mip_rel_gap when optimal).")
    planner_version: str
    min_feasible_budget_gib: float | None = Field(
        None, description="When infeasible: the smallest budget that has a plan."
    )
    modules: list[PlannedModule] = Field(default_factory=list)

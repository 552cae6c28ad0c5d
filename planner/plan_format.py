"""Plan format: what the planner answers, as JSON."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["PlanStatus", "PlanMoment", "PlannedModule", "Plan"]

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
        description="Activation memory freed vs. no checkpointing: autograd-saved bytes minus bytes the policy keeps "
        "and the inputs checkpointing holds (held_input_bytes)."
    )
    saved_bytes: int = Field(description="Bytes of op outputs the policy keeps.")
    recompute_ms: float = Field(description="What checkpointing the module costs in backward: the runtime of its "
                                            "recomputed ops plus checkpoint_overhead_ms.")
    checkpoint_overhead_ms: float = Field(0.0, description="Checkpointing's own cost for this module (re-running "
                                                           "its forward code and the policy per op), from the stats.")
    save: list[int] = Field(description="1 = save, 0 = recompute, one per op of the module in the stats.")
    op_names: list[str] | None = Field(
        None, description="The module's op names, aligned with save: lets apply_plan verify the model runs the same ops."
    )

    def __repr__(self) -> str:  # one line, not the save and op_names lists
        return (f"PlannedModule({self.fqn}: discard {self.discard_ratio:.3f}, {_gib(self.discarded_bytes)} freed, "
                f"recompute {self.recompute_ms:.4g} ms, {sum(self.save)}/{len(self.save)} ops saved)")

    __str__ = __repr__


class PlanMoment(BaseModel):
    """The step's memory at one key moment, without and with the plan."""

    model_config = ConfigDict(extra="forbid")

    phase: str = Field(description="forward, backward, optimizer (the step model) or module (PyTorch's model).")
    module: str | None = Field(None, description="The module running then, if any.")
    baseline_bytes: int = Field(description="Memory at this moment with no checkpointing.")
    planned_bytes: int | None = Field(None, description="Memory at this moment with the plan (null without a plan).")
    micro_batch: int | None = Field(None, exclude_if=lambda v: v is None, description="With gradient "
                                    "accumulation: the micro-batch of this moment, from 1 (absent: the only one, "
                                    "or the optimizer step).")


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
    recompute_ms: float | None = Field(None, description="Total recompute time of the plan, per forward and "
                                       "backward (per micro-batch with gradient accumulation): the recomputed ops' "
                                       "runtimes (on compute_ms's basis) plus each checkpointed module's host "
                                       "overhead (checkpoint_overhead_ms, per call), which compute_ms leaves out.")
    grad_accumulation: int | None = Field(None, exclude_if=lambda v: v is None, description="Micro-batches per "
                                          "optimizer step, from the stats (absent: one).")
    recompute_ms_per_optimizer_step: float | None = Field(
        None, exclude_if=lambda v: v is None, description="With gradient accumulation: recompute_ms times the "
        "micro-batches (every micro-batch recomputes).")
    peak_micro_batch: int | None = Field(None, exclude_if=lambda v: v is None, description="With gradient "
                                         "accumulation: the micro-batch the peak is in (absent: the optimizer step).")
    baseline_peak_bytes: int = Field(description="Peak memory with no checkpointing.")
    compute_ms: float = Field(description="Forward + backward time of the step without recomputation (of one "
                                          "micro-batch with gradient accumulation): its ops' runtimes alone "
                                          "(roofline or timed per op), no host overhead.")
    solve_seconds: float = 0.0
    mip_gap: float | None = Field(None, description="Proven relative optimality gap (at most the requested mip_rel_gap when optimal).")
    planner_version: str
    min_feasible_budget_gib: float | None = Field(
        None, description="When infeasible: the smallest budget that has a plan."
    )
    memory_model: str = Field("torch", description="step: the collected step's own timeline (sacplan's stats); "
                                                   "torch: PyTorch's sac_milp model (PyTorch-format or older stats).")
    memory_model_note: str = Field("", description="Which memory model, which step (steady state or first), and why.")
    first_step_only: bool = Field(False, description="True: the plan holds for the first step only (no optimizer "
                                                     "state yet); false: for every step.")
    peak_at: str | None = Field(None, description="Where the peak is: 'backward of Model.layers.3', 'optimizer "
                                                  "step', ... (with the plan, or without when there is none).")
    modules: list[PlannedModule] = Field(default_factory=list)
    timeline: list[PlanMoment] = Field(default_factory=list, description="The step's memory at every key moment, "
                                                                         "in step order, without and with the plan.")

    def __repr__(self) -> str:  # a few lines, not every op's save flag and the timeline (model_dump() has those)
        lines = [f"Plan({self.status}, budget {self.memory_budget_gib:g} GiB, world size {self.world_size}: "
                 f"peak {_gib(self.peak_bytes)} (no checkpointing {_gib(self.baseline_peak_bytes)}), "
                 f"recompute {'-' if self.recompute_ms is None else f'{self.recompute_ms:.4g} ms'}, "
                 f"{len(self.modules)} modules checkpointed"]
        if self.min_feasible_budget_gib is not None:
            lines[0] += f", smallest budget with a plan {self.min_feasible_budget_gib:g} GiB"
        shown = self.modules[:_SHOWN_MODULES]
        lines += [f"  {m!r}" for m in shown]
        if len(self.modules) > len(shown):
            lines.append(f"  ... and {len(self.modules) - len(shown)} more")
        return "\n".join(lines) + ")"

    __str__ = __repr__


_SHOWN_MODULES = 4


def _gib(n: int | None) -> str:
    """Bytes in the largest binary unit that keeps the figure at least 1 (GiB, MiB, KiB)."""
    if n is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n} B"

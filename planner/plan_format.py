"""Plan format: what the planner answers, as JSON."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["PlanStatus", "PlanMoment", "PlannedModule", "OffloadWindow", "Plan"]

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
    offload: list[int] | None = Field(
        None, exclude_if=lambda v: v is None, description="With offload: 1 = this saved op's output goes to host "
        "memory in the forward and comes back before the module's backward (save is 1 there), one per op as save; "
        "absent: nothing offloaded.")
    offloaded_bytes: int | None = Field(None, exclude_if=lambda v: v is None, description="With offload: bytes of "
                                        "the module's offloaded op outputs (part of saved_bytes).")
    offload_calls: int | None = Field(None, exclude_if=lambda v: v is None, description="With offload, a module "
                                      "called more than once: its calls, each of which offloads these ops (copied "
                                      "when the call's forward ends and dropped then, fetched in that call's "
                                      "backward; the host holds offload_calls x offloaded_bytes); absent: the "
                                      "window protocol.")

    @model_validator(mode="after")
    def _offload_saved(self) -> PlannedModule:
        if self.offload is not None:
            if len(self.offload) != len(self.save):
                raise ValueError(f"offload of {self.fqn!r} has {len(self.offload)} entries, save {len(self.save)}")
            for k, (o, s) in enumerate(zip(self.offload, self.save)):
                if o not in (0, 1) or (o and not s):
                    raise ValueError(f"offload[{k}] of {self.fqn!r} is {o!r}: 0, or 1 where save[{k}] is 1 "
                                     f"(save[{k}] is {s})")
        return self

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


class OffloadWindow(BaseModel):
    """One offload window: a stretch of the forward whose offloads wait for the next window's end.

    Windows partition the forward post-order; window j ends when the forward of ``end_module`` ends. Its
    offloaded outputs are copied to host memory as they are made and dropped from the device at the end of
    window j+1's forward; in the backward they are fetched back when window j+1's backward starts.
    """

    model_config = ConfigDict(extra="forbid")

    index: int = Field(description="The window's number in forward order, from 0.")
    end_module: str = Field(description="The module whose forward ends the window ('' for the root: the last "
                                        "window).")
    offloaded_bytes: int = Field(description="Bytes the window's modules offload.")
    d2h_ms: float = Field(description="Their copy to host memory at the link's device-to-host speed.")
    forward_ms: float = Field(description="The next window's forward compute, which the copy overlaps.")
    h2d_ms: float = Field(description="Their copy back at the link's host-to-device speed.")
    backward_ms: float = Field(description="The next window's backward compute (without recompute), which the copy "
                                           "back overlaps.")
    stall_ms: float = Field(description="What the copies add to the step: max(0, d2h_ms - forward_ms) + "
                                        "max(0, h2d_ms - backward_ms).")


def _none(v) -> bool:
    return v is None


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
    offload: Literal["on"] | None = Field(None, exclude_if=_none, description="'on': the plan may offload saved "
                                          "op outputs of checkpointed modules to host memory (absent: it does not).")
    host_link_gbps: dict[str, float] | None = Field(None, exclude_if=_none, description="With offload: the host "
                                                    "link figures used, GB/s per direction ({'d2h': .., 'h2d': ..}).")
    host_bytes: int | None = Field(None, exclude_if=_none, description="With offload: host memory the offloaded "
                                   "outputs take per rank (per micro-batch): the sum over windows.")
    offload_stall_ms: float | None = Field(None, exclude_if=_none, description="With offload: what the copies add "
                                           "to the step where they outlast the compute they overlap.")
    step_overhead_ms: float | None = Field(None, exclude_if=_none, description="With offload: recompute_ms + "
                                           "offload_stall_ms, what the plan minimises.")
    offload_windows: list[OffloadWindow] | None = Field(None, exclude_if=_none, description="With offload: the "
                                                        "windows in forward order, what apply's waits and prefetches "
                                                        "follow.")
    prefetch_distance: int | None = Field(None, exclude_if=_none, description="With offload: how many windows "
                                          "ahead the backward fetches offloaded outputs back (1).")
    timeline: list[PlanMoment] = Field(default_factory=list, description="The step's memory at every key moment, "
                                                                         "in step order, without and with the plan.")

    def __repr__(self) -> str:  # a few lines, not every op's save flag and the timeline (model_dump() has those)
        lines = [f"Plan({self.status}, budget {self.memory_budget_gib:g} GiB, world size {self.world_size}: "
                 f"peak {_gib(self.peak_bytes)} (no checkpointing {_gib(self.baseline_peak_bytes)}), "
                 f"recompute {'-' if self.recompute_ms is None else f'{self.recompute_ms:.4g} ms'}, "
                 f"{len(self.modules)} modules checkpointed"]
        if self.min_feasible_budget_gib is not None:
            lines[0] += f", smallest budget with a plan {self.min_feasible_budget_gib:g} GiB"
        if self.host_bytes is not None and self.offload_stall_ms is not None:
            lines[0] += f", offloaded {_gib(self.host_bytes)} (stall {self.offload_stall_ms:.4g} ms)"
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

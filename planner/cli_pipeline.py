"""``sacplan plan STAGE0.json STAGE1.json ...``: every stage of a pipeline planned under one budget."""

from __future__ import annotations

import sys

from planner.memory_model import GIB
from planner.pipeline_planning import PipelinePlan, plan_pipeline
from planner.stats.format import Stats

__all__ = ["pipeline_exit_code", "pipeline_table", "run_pipeline_plan"]


def pipeline_table(pp: PipelinePlan) -> str:
    """Each stage's plan and peak, then the pipeline's predicted step."""
    lines = [f"pipeline         {pp.stages_count} stages, {pp.schedule}, {pp.microbatches} microbatches",
             f"status           {pp.status}",
             f"budget           {pp.memory_budget_gib:g} GiB per stage",
             "", "stage  in flight  status      peak GiB  baseline GiB  checkpointed  recompute ms  microbatch ms"]
    for k, p in enumerate(pp.stages):
        peak = "-" if p.peak_bytes is None else f"{p.peak_bytes / GIB:.5g}"
        rc = "-" if p.recompute_ms is None else f"{p.recompute_ms:.3f}"
        ms = "-" if pp.stage_ms[k] is None else f"{pp.stage_ms[k]:.3f}"
        lines.append(f"{k:>5}  {pp.in_flight[k]:>9}  {p.status:<10}  {peak:>8}  {p.baseline_peak_bytes / GIB:>12.5g}  "
                     f"{len(p.modules):>12}  {rc:>12}  {ms:>13}")
    if pp.step_ms is not None:
        lines += ["", f"step             {pp.step_ms:.3f} ms predicted (slowest stage {pp.slowest_stage}; bubbles "
                  f"{pp.bubble_ms:.3f} ms)"]
    if pp.message:
        lines.append(f"note             {pp.message}")
    for k, p in enumerate(pp.stages):
        if p.modules:
            lines += ["", f"stage {k}: " + ", ".join(f"{m.fqn} ({m.discard_ratio:.2f})" for m in p.modules)]
    return "\n".join(lines)


def pipeline_exit_code(pp: PipelinePlan) -> int:
    """As ``sacplan plan``: 0 a plan for every stage, 2 a stage infeasible, 3 no plan for another reason."""
    if pp.status in ("optimal", "feasible"):
        return 0
    return 2 if pp.status == "infeasible" else 3


def run_pipeline_plan(stats: list[Stats], budget_gib: float, options: dict, as_json: bool) -> int:
    """Plan the stages, print the table or the JSON; the exit code (1 for options or stats that do not fit)."""
    try:
        pp = plan_pipeline(stats, budget_gib, **options)
    except ValueError as exc:
        print(f"sacplan: {exc}", file=sys.stderr)
        return 1
    print(pp.model_dump_json(indent=2) if as_json else pipeline_table(pp))
    if pp.status == "infeasible":
        print(f"sacplan: {pp.message}", file=sys.stderr)
    return pipeline_exit_code(pp)

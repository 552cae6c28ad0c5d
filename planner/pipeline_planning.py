"""Planning every stage of a pipeline under one device budget, and the pipeline's predicted step time."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from planner.memory_model import GIB, compute_ms
from planner.options import PlanOptions, plan_options
from planner.pipeline_interleaved import interleaved_in_flight
from planner.pipeline_schedule import in_flight
from planner.plan_format import Plan
from planner.planning import StatsInput, plan
from planner.stats.format import Stats
from planner.stats.pipeline import PipelineStageInfo
from planner.stats.loader import load_stats, parse_stats

__all__ = ["PipelinePlan", "plan_pipeline", "pipeline_plan_of", "pipeline_step_ms"]


class PipelinePlan(BaseModel):
    """One plan per stage under one budget, and what the pipeline's step is predicted to take."""

    status: Literal["optimal", "feasible", "infeasible", "time_limit", "error"] = Field(
        description="The worst of the stages' statuses.")
    message: str = ""
    memory_budget_gib: float
    schedule: str
    stages_count: int = Field(description="Pipeline stages.")
    microbatches: int
    stages: list[Plan] = Field(description="One plan per stage, in stage order.")
    in_flight: list[int] = Field(description="Per stage, the most microbatches it holds at once (interleaved: "
                                 "chunk-microbatches, summed over the rank's chunks).")
    stage_ms: list[float | None] = Field(description="Per stage, one microbatch's forward + backward + recompute "
                                         "(null where the stage has no plan).")
    step_ms: float | None = Field(None, description="Predicted step time: the stages' microbatch times through the "
                                  "schedule, bubbles included (sum over stages + (M - 1) x the slowest).")
    bubble_ms: float | None = Field(None, description="What of step_ms is idle on the slowest stage: step_ms less "
                                    "M x its microbatch time.")
    slowest_stage: int | None = None
    infeasible_stage: int | None = Field(None, description="The first stage with no plan under the budget.")
    min_feasible_budget_gib: float | None = Field(None, description="Infeasible: the smallest budget under which "
                                                  "every stage has a plan (the largest of the stages' own).")


_ORDER = ("optimal", "feasible", "time_limit", "error", "infeasible")


def pipeline_step_ms(stage_ms: Sequence[float], microbatches: int, virtual_stages: int = 1) -> float:
    """The step of a pipeline from each stage's (rank's) microbatch time (forward + backward): the slowest rank
    runs all M microbatches, and the others' times, divided by the chunks per rank, are the bubble (GPipe and
    1F1B: the first microbatch passes every stage, the other M - 1 follow at the pace of the slowest;
    interleaved: a bubble V times smaller, Narayanan et al. 2021; see docs/pipeline.md)."""
    slowest = max(stage_ms)
    return microbatches * slowest + (math.fsum(stage_ms) - slowest) / virtual_stages


def _in_flight(info: Any, stage: int) -> int:
    if info.chunks:
        return interleaved_in_flight(stage, info.stages, info.virtual_stages, info.microbatches)
    return in_flight(info.schedule, stage, info.stages, info.microbatches)


def _stage_stats(stats: Sequence[StatsInput]) -> list[Stats]:
    """The stages' stats in stage order; ValueError naming the document that does not fit."""
    docs = []
    for k, s in enumerate(stats):
        doc = s if isinstance(s, Stats) else load_stats(s) if isinstance(s, (str, os.PathLike)) else parse_stats(s)
        if doc.metadata.pipeline is None:
            raise ValueError(f"stats[{k}] is not a pipeline stage's (no metadata.pipeline): collect with --pp-stages")
        docs.append(doc)
    first = docs[0].metadata.pipeline
    for k, doc in enumerate(docs):
        p = doc.metadata.pipeline
        for name in ("stages", "schedule", "microbatches", "virtual_stages"):
            if getattr(p, name) != getattr(first, name):
                raise ValueError(f"stats[{k}] pipeline.{name} {getattr(p, name)!r} differs from stats[0]'s "
                                 f"{getattr(first, name)!r}: give the stages of one collection")
    got = sorted(d.metadata.pipeline.stage for d in docs)
    if got != list(range(first.stages)):
        raise ValueError(f"stats are stages {got}; a {first.stages}-stage pipeline needs each of "
                         f"{list(range(first.stages))} once")
    return sorted(docs, key=lambda d: d.metadata.pipeline.stage)


def plan_pipeline(stats: Sequence[StatsInput], memory_budget_gib: float, *, options: PlanOptions | None = None,
                  **option_values: Any) -> PipelinePlan:
    """Plan every stage of a pipeline (its stats, one per stage, any order) under one budget per device.

    Each stage is planned on its own memory along its schedule (:mod:`planner.pipeline_schedule`); the step
    time is :func:`pipeline_step_ms` of each stage's forward + backward + recompute of one microbatch. Options
    as for :func:`planner.plan`; ``time_limit_s`` is per stage.
    """
    opts = plan_options(options, **option_values)
    docs = _stage_stats(stats)
    info = docs[0].metadata.pipeline
    plans = [plan(d, memory_budget_gib, options=opts) for d in docs]
    return pipeline_plan_of(info, [compute_ms(d) for d in docs], plans, memory_budget_gib)


def pipeline_plan_of(info: PipelineStageInfo, stage_compute_ms: Sequence[float], plans: list[Plan],
                     memory_budget_gib: float) -> PipelinePlan:
    """The pipeline's answer from each stage's plan (in stage order) and its compute (forward + backward of one
    microbatch, :func:`planner.compute_ms`); ``info`` is any stage's pipeline metadata. The service plans each
    stage through its plan cache and calls this."""
    status = max((p.status for p in plans), key=_ORDER.index)
    times = [None if p.status not in ("optimal", "feasible") else c + (p.recompute_ms or 0.0)
             for c, p in zip(stage_compute_ms, plans)]
    bad = next((k for k, p in enumerate(plans) if p.status == "infeasible"), None)
    out = PipelinePlan(status=status, memory_budget_gib=memory_budget_gib, schedule=info.schedule,
                       stages_count=info.stages, microbatches=info.microbatches, stages=plans,
                       in_flight=[_in_flight(info, k) for k in range(info.stages)], stage_ms=times)
    if all(t is not None for t in times):
        out.step_ms = pipeline_step_ms(times, info.microbatches, info.virtual_stages)
        out.slowest_stage = max(range(len(times)), key=times.__getitem__)
        out.bubble_ms = out.step_ms - info.microbatches * times[out.slowest_stage]
    if bad is not None:
        out.infeasible_stage = bad
        out.min_feasible_budget_gib = max(p.min_feasible_budget_gib or 0.0 for p in plans)
        out.message = (f"stage {bad} has no plan under {memory_budget_gib:g} GiB (its smallest budget is "
                       f"{plans[bad].min_feasible_budget_gib:g} GiB); every stage fits "
                       f"{out.min_feasible_budget_gib:g} GiB")
    else:
        out.message = f"every stage fits {memory_budget_gib:g} GiB ({_peaks(plans)})"
    return out


def _peaks(plans: list[Plan]) -> str:
    return ", ".join(f"stage {k} peak {p.peak_bytes / GIB:.4g} GiB" for k, p in enumerate(plans)
                     if p.peak_bytes is not None)

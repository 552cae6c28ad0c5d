"""The response examples of the OpenAPI document, made by the real planner from the example requests.

Nothing here is typed in: the stats example is stored as an upload would be
(``service.store.stats``), planned by ``planner.plan``/``planner.sweep`` with the
example requests' options, and written by the functions that write the
responses. The ids are fixed examples of opaque ids (``service.store.ids.EXAMPLE_IDS``:
the service's are random); the times are when the examples were made.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any

import planner
from service.config import DEFAULT_PROJECT
from service.examples import (EXAMPLE_PIPELINE_BUDGET_GIB, EXAMPLE_PIPELINE_STATS, EXAMPLE_PLAN_REQUEST, EXAMPLE_STATS,
                              EXAMPLE_SWEEP_REQUEST)
from service.schemas import PipelinePlanOut, PipelinePlanRequest, PlanRequest, StatsDetail, SweepRequest
from service.solving import solve_job
from service.store import EXAMPLE_IDS, CachedPlan, SweepRecord, new_stats_record, plan_json
from service.views import module_tree_json, pipeline_plan_out, stats_summary, sweep_out, sweep_point

__all__ = ["response_examples", "as_stored"]


@lru_cache(maxsize=1)
def response_examples() -> dict[str, dict[str, Any]]:
    """An example per response model name (``StatsSummary``, ``StatsDetail``, ``PlanOut``, ``SweepOut``,
    ``PipelinePlanOut``)."""
    now = datetime.now(timezone.utc)
    stats = planner.parse_stats(EXAMPLE_STATS)
    row = new_stats_record(DEFAULT_PROJECT, EXAMPLE_STATS)
    row.id, row.created_at = EXAMPLE_IDS["stats"], now
    summary = stats_summary(row)

    plan_request = PlanRequest.model_validate(EXAMPLE_PLAN_REQUEST)
    plans = _Plans(row.id, row.document, now)
    plan = plans.solve([plan_request.memory_budget_gib], plan_request.cache_fields())[0]

    sweep_request = SweepRequest.model_validate(EXAMPLE_SWEEP_REQUEST)
    points = [sweep_point(p) for p in plans.solve(sweep_request.budgets(), sweep_request.cache_fields())]
    sweep = SweepRecord(id=EXAMPLE_IDS["sweep"], stats_id=row.id, created_at=now)
    return {
        "StatsSummary": summary.model_dump(mode="json"),
        "StatsDetail": StatsDetail(**summary.model_dump(),
                                   module_tree=json.loads(module_tree_json(stats))).model_dump(mode="json"),
        "PlanOut": json.loads(plan_json(plan)),
        "SweepOut": sweep_out(sweep, row, points, cached=all(p.cached for p in points)).model_dump(mode="json"),
        "PipelinePlanOut": _pipeline_example(now).model_dump(mode="json"),
    }


def _pipeline_example(now: datetime) -> PipelinePlanOut:
    """The example stages uploaded, and planned at the example budget as ``POST /v1/pipeline-plans`` plans them."""
    ids = [EXAMPLE_IDS[f"pipeline_stage{k}"] for k in range(len(EXAMPLE_PIPELINE_STATS))]
    request = PipelinePlanRequest(stats_ids=ids, memory_budget_gib=EXAMPLE_PIPELINE_BUDGET_GIB)
    rows, plans = [], []
    for k, (stats_id, doc) in enumerate(zip(ids, EXAMPLE_PIPELINE_STATS)):
        row = new_stats_record(DEFAULT_PROJECT, doc)
        row.id, row.created_at = stats_id, now
        rows.append(row)
        # plan ids after those of the plan and sweep examples
        plans += _Plans(row.id, row.document, now, first=16 + k).solve([request.memory_budget_gib],
                                                                        request.cache_fields())
    info = planner.parse_stats(EXAMPLE_PIPELINE_STATS[0]).metadata.pipeline
    return pipeline_plan_out(EXAMPLE_IDS["pipeline_plan"], now, ids, info, [r.compute_ms for r in rows], plans,
                             request.memory_budget_gib, cached=False)


def as_stored(example: dict[str, Any]) -> dict[str, Any]:
    """``example`` as served again from the store (a 200): every ``cached`` flag true."""
    if "cached" not in example:
        return example
    stored = {**example, "cached": True}
    for name in ("points", "stages"):
        if name in stored:
            stored[name] = [{**p, "cached": True} for p in stored[name]]
    return stored


class _Plans:
    """Plans as the service's cache would hold them: a new id per new request, the same plan for the same one."""

    def __init__(self, stats_id: str, document: str, created_at: datetime, *, first: int = 0):
        self.stats_id = stats_id
        self.document = document
        self.created_at = created_at
        self.stored: dict[str, CachedPlan] = {}
        self.first = first  # this one's first plan id: _example_plan_id(first)

    def solve(self, budgets_gib: list[float], fields: dict[str, Any]) -> list[CachedPlan]:
        requests = [{**fields, "memory_budget_gib": b} for b in budgets_gib]
        keys = [json.dumps(r, sort_keys=True) for r in requests]
        missing = [b for b, k in zip(budgets_gib, keys) if k not in self.stored]
        # What a solver process runs for the service, here in this one.
        solved = iter(solve_job(self.document, missing, fields)["plans"] if missing else [])
        out = []
        for request, key in zip(requests, keys):
            if key in self.stored:
                out.append(CachedPlan(**{**vars(self.stored[key]), "cached": True}))
                continue
            plan = next(solved)
            self.stored[key] = CachedPlan(_example_plan_id(self.first + len(self.stored)), self.stats_id, self.created_at, request,
                                          json.dumps(plan, separators=(",", ":")), cached=False)
            out.append(self.stored[key])
        return out


def _example_plan_id(k: int) -> str:
    """The ``k``-th example plan's id: the plan example's, then the same with its last digits counting."""
    base = EXAMPLE_IDS["plan"]
    return base if k == 0 else f"{base[:-4]}{k:04x}"

"""The answers routes declare besides their success one, for the OpenAPI document, written once.

Each is a dict to merge into a route's ``responses``: ``responses={**NOT_FOUND, **STALE_STATS}``.
"""

from __future__ import annotations

from typing import Any

from service.schemas import ErrorOut, PipelinePlanOut, PlanOut, StatsSummary, SweepOut

__all__ = [
    "PNG", "NOT_FOUND", "STATS_NOT_FOUND", "STALE_STATS", "INVALID_REQUEST", "INVALID_STATS", "SOLVER_BUSY",
    "SOLVE_ERRORS", "TOO_LARGE", "RENDER_BUSY", "ALREADY_UPLOADED", "PLAN_FROM_CACHE", "SWEEP_FROM_CACHE",
    "PIPELINE_FROM_CACHE",
    "DATABASE_UNREACHABLE",
]

Responses = dict[int | str, dict[str, Any]]

PNG: Responses = {200: {"content": {"image/png": {}}, "description": "A PNG chart"}}
ALREADY_UPLOADED: Responses = {
    200: {"model": StatsSummary, "description": "Same stats uploaded before: the existing upload"}
}
PLAN_FROM_CACHE: Responses = {
    200: {"model": PlanOut, "description": "From the plan cache (cached: true, no solve); or status 'error' or "
                                           "'time_limit', nothing stored. time_limit_s bounds the whole request "
                                           "from its arrival: when it passes before inline stats are validated "
                                           "and stored, the answer comes at the limit with stats_id, "
                                           "baseline_peak_bytes and compute_ms null and a message saying so, "
                                           "and nothing is stored, then or later (upload such stats with POST "
                                           "/v1/stats, which has no time limit)"}
}
SWEEP_FROM_CACHE: Responses = {
    200: {"model": SweepOut, "description": "The same sweep as asked before: the stored one, every point cached; "
                                            "or a point failed (id null, nothing stored); or time_limit_s passed "
                                            "before inline stats were validated and stored: every point "
                                            "'time_limit', stats_id, created_at, baseline_peak_bytes and "
                                            "compute_ms null, a message saying so, nothing stored"}
}
PIPELINE_FROM_CACHE: Responses = {
    200: {"model": PipelinePlanOut, "description": "The same pipeline plan as asked before: the stored one, every "
                                                   "stage's plan cached; or a stage's status 'error', nothing stored"}
}
NOT_FOUND: Responses = {404: {"model": ErrorOut, "description": "No such id in your project"}}
STATS_NOT_FOUND: Responses = {404: {"model": ErrorOut, "description": "No such stats id in your project"}}
STALE_STATS: Responses = {409: {"model": ErrorOut, "description": "The stats were stored by an older planner and "
                                                                  "fail this one's validation: upload them "
                                                                  "corrected, or delete them"}}
INVALID_REQUEST: Responses = {
    422: {"model": ErrorOut, "description": "Invalid request field, or invalid inline stats (the field and value "
                                            "named; nothing stored)"}
}
INVALID_STATS: Responses = {
    422: {"model": ErrorOut, "description": "Invalid stats: the field and value named; nothing stored"}
}
SOLVER_BUSY: Responses = {
    503: {"model": ErrorOut, "description": "Solver queue full: retry after Retry-After seconds"},
    429: {"model": ErrorOut, "description": "Your project has its share of the solver running or waiting "
                                            "(SACPLAN_SOLVER_PER_PROJECT): retry after Retry-After seconds"},
}
TOO_LARGE: Responses = {
    413: {"model": ErrorOut, "description": "The stats pass one of this service's upload limits (modules, ops, "
                                            "nesting depth) or the body size limit: the limit and value named"}
}
RENDER_BUSY: Responses = {
    503: {"model": ErrorOut, "description": "Render queue full (SACPLAN_RENDER_WORKERS / SACPLAN_RENDER_QUEUE_SIZE): "
                                            "retry after Retry-After seconds"}
}
DATABASE_UNREACHABLE: Responses = {503: {"description": "Database unreachable"}}

# Everything a request that may solve can answer instead of a plan.
SOLVE_ERRORS: Responses = {**NOT_FOUND, **STALE_STATS, **INVALID_REQUEST, **SOLVER_BUSY, **TOO_LARGE}

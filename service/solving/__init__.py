"""Solving: cached, or solved once, for plans and sweeps alike; the solver processes that do it.

``plans`` (the one place a request's plans are decided: from the plan cache,
else solved once and stored; ``pipelines``: every stage of a pipeline through it), ``claims`` (one solve per set of plan keys
across worker processes and replicas, through a row in the database),
``pool`` (solver processes with hard deadlines, a memory cap and per-project
shares), ``process`` (the solver process's own side: its loop and the plan
job) and ``lifeline`` (worker processes that die with the service). Imports
``service.store``, ``service.transport`` and the top-level modules.
"""

from service.lazy import exports

__all__ = [
    # plans
    "plans_for", "cached_or_solved", "stopped_plans",
    # pipelines
    "pipeline_plans_for", "pipeline_info", "PipelineStages",
    # claims
    "solve_once", "CLAIM_TTL_S", "LINGER_S",
    # pool
    "SolverPool", "SolverStopped",
    # process
    "solve_job", "rss_bytes",
    # lifeline
    "die_with_parent",
]

# The process side first: looking up solve_job or die_with_parent loads nothing else.
__getattr__ = exports(__name__, ("lifeline", "process", "pool", "claims", "plans", "pipelines"), __all__)

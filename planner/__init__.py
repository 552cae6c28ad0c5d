"""sacplan planner: the stats format, the exact op-level policy and the module-level engines.

numpy, scipy and pydantic only: never torch, fastapi or sqlalchemy. The
layers, each importing only those before it: ``stats/`` (the format),
``ops/`` (one module's op decisions), ``memory_model`` and ``solve/`` (the
module-level problem, its engines and bounds), ``planning`` (``plan()`` and
``sweep()``, the one entry point; ``pipeline_planning``: ``plan_pipeline()``, every stage of a pipeline). See docs/architecture.md.
"""

from planner.figures import HOST_OVERHEAD_NOTE, RecomputeSplit, recompute_split, step_basis
from planner.memory_model import GIB, MemoryModel, baseline_peak_bytes, compute_ms, memory_model
from planner.ops.frontier import Frontier, module_frontier
from planner.ops.groups import MUST_SAVE_OPS
from planner.ops.policy import optimal_op_policy
from planner.options import PlanOptions
from planner.plan_format import OffloadWindow, Plan, PlannedModule, PlanStatus
from planner.planning import min_feasible_budget_gib, plan, sweep
from planner.pipeline_planning import PipelinePlan, pipeline_plan_of, pipeline_step_ms, plan_pipeline
from planner.pipeline_split import SplitChoice, choose_pipeline_split
from planner.stats.format import STATS_FORMAT, ModuleStats, Moment, OpStats, Stats, StatsMetadata, stats_hash
from planner.stats.loader import StatsError, from_torch_format, load_stats, parse_stats
from planner.stats.metadata import HostLink
from planner.stats.sharding import Sharding, sharding_scope
from planner.version import PLANNER_VERSION

__all__ = [
    "MUST_SAVE_OPS",
    "GIB",
    "HOST_OVERHEAD_NOTE",
    "PLANNER_VERSION",
    "STATS_FORMAT",
    "Frontier",
    "HostLink",
    "MemoryModel",
    "ModuleStats",
    "Moment",
    "OffloadWindow",
    "OpStats",
    "Plan",
    "PlanOptions",
    "PipelinePlan",
    "PlanStatus",
    "PlannedModule",
    "RecomputeSplit",
    "Sharding",
    "sharding_scope",
    "Stats",
    "StatsError",
    "StatsMetadata",
    "baseline_peak_bytes",
    "compute_ms",
    "from_torch_format",
    "load_stats",
    "memory_model",
    "min_feasible_budget_gib",
    "module_frontier",
    "optimal_op_policy",
    "parse_stats",
    "pipeline_plan_of",
    "pipeline_step_ms",
    "SplitChoice",
    "choose_pipeline_split",
    "plan",
    "plan_pipeline",
    "recompute_split",
    "stats_hash",
    "step_basis",
    "sweep",
]

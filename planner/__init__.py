"""sacplan planner: stats format, exact op-level policy, module-level MILP.

numpy, scipy and pydantic only: never torch, fastapi or sqlalchemy.
"""

from planner.loader import StatsError, from_torch_format, load_stats, parse_stats
from planner.memory_model import GIB, MemoryModel, baseline_peak_bytes, compute_ms, memory_model
from planner.op_policy import Frontier, module_frontier, optimal_op_policy
from planner.plan_format import Plan, PlannedModule
from planner.planning import plan, sweep
from planner.stats import STATS_FORMAT, ModuleStats, OpStats, Stats, StatsMetadata, stats_hash
from planner.version import PLANNER_VERSION

__all__ = [
    "GIB",
    "PLANNER_VERSION",
    "STATS_FORMAT",
    "Frontier",
    "MemoryModel",
    "ModuleStats",
    "OpStats",
    "Plan",
    "PlannedModule",
    "Stats",
    "StatsError",
    "StatsMetadata",
    "baseline_peak_bytes",
    "compute_ms",
    "from_torch_format",
    "load_stats",
    "memory_model",
    "module_frontier",
    "optimal_op_policy",
    "parse_stats",
    "plan",
    "stats_hash",
    "sweep",
]

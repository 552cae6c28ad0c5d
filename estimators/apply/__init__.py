"""Applying a plan: wrap the planned modules with selective activation checkpointing.

The flow: ``wrap.apply_plan`` matches the model to the stats' settings
(``settings_match``), builds each planned module's policy (``policy``: the
decision each op it runs gets, carried over by ``alignment``) and, given an
example batch, proves the plan maps on one dry step (``dry_check``). Imports
only ``estimators.common`` of its siblings.
"""

from estimators.apply.alignment import TOLERATED_OPS, AmbiguousAlignment, StatsOps, align
from estimators.apply.dry_check import COMPILE_BACKENDS, check_plan
from estimators.apply.policy import PlanMismatchError, planned_modules
from estimators.apply.wrap import apply_plan, remove_plan

__all__ = ["COMPILE_BACKENDS", "TOLERATED_OPS", "AmbiguousAlignment", "PlanMismatchError", "StatsOps", "align", "apply_plan",
           "check_plan", "planned_modules", "remove_plan"]

"""sacplan estimators: the PyTorch side.

The fake-tensor stats collector, the device cost model and applying a plan
to a model. The only package of the project that imports torch; names are
loaded lazily so ``estimators.cli`` (and ``sacplan --help``) work without it.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "DEVICES",
    "BenchmarkCostModel",
    "DeviceSpec",
    "PlanMismatchError",
    "RooflineCostModel",
    "apply_plan",
    "check_plan",
    "remove_plan",
    "collect_stats",
    "device_spec",
    "module_fqns",
    "op_name",
]

_WHERE = {
    "DEVICES": "estimators.devices",
    "DeviceSpec": "estimators.devices",
    "device_spec": "estimators.devices",
    "BenchmarkCostModel": "estimators.cost_model",
    "RooflineCostModel": "estimators.cost_model",
    "PlanMismatchError": "estimators.apply",
    "apply_plan": "estimators.apply",
    "check_plan": "estimators.plan_check",
    "remove_plan": "estimators.apply",
    "collect_stats": "estimators.collector",
    "module_fqns": "estimators.collector",
    "op_name": "estimators.aten_ops",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'estimators' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)

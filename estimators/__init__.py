"""sacplan estimators: the PyTorch side.

The fake-tensor stats collector, the device cost model and applying a plan
to a model. The only package of the project that imports torch.
"""

from estimators.apply import PlanMismatchError, apply_plan
from estimators.collector import collect_stats, module_fqns, op_name
from estimators.cost_model import BenchmarkCostModel, RooflineCostModel
from estimators.devices import DEVICES, DeviceSpec, device_spec

__all__ = [
    "DEVICES",
    "BenchmarkCostModel",
    "DeviceSpec",
    "PlanMismatchError",
    "RooflineCostModel",
    "apply_plan",
    "collect_stats",
    "device_spec",
    "module_fqns",
    "op_name",
]

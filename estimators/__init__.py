"""sacplan estimators: the PyTorch side, the only package of the project that imports torch.

Four jobs, one subpackage each, over what they share:

* ``estimators.collect``: one training step under fake tensors, written as
  stats (what ``sacplan collect`` runs);
* ``estimators.apply``: a plan applied to the user's model with selective
  activation checkpointing, checked on a dry step;
* ``estimators.measure``: real steps on this machine (one process, or ranks
  of an FSDP2 job on gloo), the ground truth plans are held to;
* ``estimators.cli``: the ``sacplan collect`` command and what it prints;
* ``estimators.common``: what the jobs share (ATen op kinds, the storage
  book, the model call and optimizer, module names, FSDP2 units).

Every name a user imports is here, loaded lazily, so ``sacplan --help`` and
the service work without torch. See docs/architecture.md.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    # collecting
    "collect_stats": "estimators.collect",
    "CollectRequest": "estimators.collect",
    "CollectResult": "estimators.collect",
    "run_collection": "estimators.collect",
    "build_from_hf_config": "estimators.collect",
    "build_from_factory": "estimators.collect",
    "BuiltModel": "estimators.collect",
    "DEVICES": "estimators.collect",
    "DeviceSpec": "estimators.collect",
    "device_spec": "estimators.collect",
    "BenchmarkCostModel": "estimators.collect",
    "RooflineCostModel": "estimators.collect",
    "MoeRouting": "estimators.collect",
    # applying
    "PlanMismatchError": "estimators.apply",
    "apply_plan": "estimators.apply",
    "check_plan": "estimators.apply",
    "remove_plan": "estimators.apply",
    # measuring
    "StepMeasure": "estimators.measure",
    "measure_steps": "estimators.measure",
    "track_live_storages": "estimators.measure",
    "FsdpStepMeasure": "estimators.measure",
    "measure_fsdp_steps": "estimators.measure",
    "run_ranks": "estimators.measure",
    "shard": "estimators.measure",
    "SettledFunctionalCollectives": "estimators.measure",
    # shared by every job
    "FsdpSetup": "estimators.common",
    "ParallelDims": "estimators.common",
    "parallelize_tp": "estimators.common",
    "TrainingLoop": "estimators.common",
    "call_model": "estimators.common",
    "default_loss": "estimators.common",
    "make_optimizer": "estimators.common",
    "module_fqns": "estimators.common",
    "op_name": "estimators.common",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'estimators' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)

"""Apply a plan: wrap the planned modules with selective activation checkpointing.

Each planned module's ``forward`` runs under ``torch.utils.checkpoint``
(non-reentrant, ``preserve_rng_state=True``) with a policy built from the
plan's ``save`` list. The policy sees the module's ops in the order the
collector recorded them (both skip ``SAC_IGNORED_OPS``), so op ``k`` of the
forward gets decision ``save[k]``; with the stats at hand each op's name is
checked too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from estimators.aten_ops import is_random_op, op_name
from estimators.collector import module_fqns

__all__ = ["apply_plan", "remove_plan", "PlanMismatchError"]

_USABLE = ("optimal", "feasible")


class PlanMismatchError(RuntimeError):
    """The model runs a different op sequence than the one the plan was made for."""


def apply_plan(model: nn.Module, plan: Any, *, stats: Any = None) -> nn.Module:
    """Checkpoint every module the plan names, saving exactly the ops it says; returns ``model``.

    ``plan`` is the plan JSON as a dict or a :class:`planner.Plan`. ``stats``
    (a :class:`planner.Stats`, its dict, or None) gives the op names to check
    each op against; without it only the op count is checked. A mismatch
    raises :class:`PlanMismatchError` naming the module and the first
    mismatching op, during the forward pass.
    """
    doc = plan.model_dump() if hasattr(plan, "model_dump") else plan
    if not isinstance(doc, Mapping):
        raise ValueError(f"plan must be a dict or a planner.Plan, got {type(plan).__name__}")
    status = doc.get("status", "optimal")
    if status not in _USABLE:
        raise ValueError(f"plan status is {status!r}: only {' or '.join(_USABLE)} plans can be applied")
    names = _op_names(stats)
    remove_plan(model)
    by_fqn = {fqn: mod for mod, fqn in module_fqns(model).items()}
    planned = list(doc.get("modules") or [])
    fqns = [str(pm.get("fqn")) for pm in planned]
    for i, fqn in enumerate(fqns):
        if fqn not in by_fqn:
            raise ValueError(f"plan modules[{i}].fqn {fqn!r} is not a module of {type(model).__name__}")
        for other in fqns:
            if other != fqn and fqn.startswith(other + "."):
                raise ValueError(f"plan modules[{i}].fqn {fqn!r} lies inside planned module {other!r}: nesting is not supported")
    for i, pm in enumerate(planned):
        save = pm.get("save")
        if not isinstance(save, Sequence) or any(s not in (0, 1) for s in save):
            raise ValueError(f"plan modules[{i}].save must be a list of 0/1, got {save!r}")
        fqn = fqns[i]
        if names is not None and fqn not in names:
            raise PlanMismatchError(f"module {fqn!r} has no op list in the stats (a leaf, or a module the collector "
                                    f"left out: see their tags['modules_left_out']), so no plan for these stats "
                                    f"checkpoints it")
        expected = names.get(fqn) if names is not None else pm.get("op_names")
        if expected is not None and len(expected) != len(save):
            raise PlanMismatchError(
                f"module {fqn!r}: the plan has {len(save)} save decisions but the stats list {len(expected)} ops"
            )
        _wrap(by_fqn[fqn], fqn, [int(s) for s in save], expected)
    return model


def remove_plan(model: nn.Module) -> nn.Module:
    """Undo :func:`apply_plan`: every wrapped module gets its own forward back; returns ``model``."""
    for mod in model.modules():
        inner = mod.__dict__.pop("_sacplan_forward", None)
        if inner is not None:
            mod.__dict__.pop("forward", None)
            if getattr(inner, "__self__", None) is not mod:  # an instance-level forward the user had set
                mod.forward = inner
    return model


def _op_names(stats: Any) -> dict[str, list[str]] | None:
    if stats is None:
        return None
    doc = stats.model_dump() if hasattr(stats, "model_dump") else stats
    return {m["fqn"]: [op["name"] for op in m["ops"]] for m in doc["modules"] if m.get("ops") is not None}


class _Policy:
    """Decisions of one checkpointed call, op by op."""

    def __init__(self, fqn: str, save: list[int], names: list[str] | None):
        self.fqn, self.save, self.names = fqn, save, names
        self.count = 0
        self.random_decision: int | None = None

    def __call__(self, ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        k = self.count
        self.count += 1
        name = op_name(func)
        if k >= len(self.save):
            raise PlanMismatchError(
                f"module {self.fqn!r}: op {k} ({name}) is beyond the {len(self.save)} ops the plan was made for"
            )
        if self.names is not None and self.names[k] != name:
            raise PlanMismatchError(f"module {self.fqn!r}: op {k} is {name} but the plan's stats have {self.names[k]}")
        decision = self.save[k]
        if is_random_op(func, args, kwargs):
            if self.random_decision is None:
                self.random_decision = decision
            elif decision != self.random_decision:
                raise PlanMismatchError(
                    f"module {self.fqn!r}: random op {k} ({name}) has save={decision} but an earlier random op "
                    f"has save={self.random_decision}: random ops must all be saved or all recomputed"
                )
        return CheckpointPolicy.MUST_SAVE if decision else CheckpointPolicy.PREFER_RECOMPUTE


def _wrap(module: nn.Module, fqn: str, save: list[int], names: list[str] | None) -> None:
    inner = module.forward
    module._sacplan_forward = inner  # layout: allow-private (our mark on the user's module, for remove_plan)

    def forward(*args: Any, **kwargs: Any) -> Any:
        policy = _Policy(fqn, save, names)
        out = checkpoint(
            inner,
            *args,
            use_reentrant=False,
            preserve_rng_state=True,
            context_fn=partial(create_selective_checkpoint_contexts, policy, allow_cache_entry_mutation=True),
            **kwargs,
        )
        if torch.is_grad_enabled() and policy.count != len(save):
            raise PlanMismatchError(
                f"module {fqn!r}: ran {policy.count} ops but the plan was made for {len(save)}"
                + (f"; the first missing op is {names[policy.count]}" if names and policy.count < len(names) else "")
            )
        return out

    module.forward = forward

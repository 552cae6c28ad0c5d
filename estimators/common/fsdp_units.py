"""How a model is sharded by FSDP2: the setup, its units, ``fully_shard`` applied to them.

One description shared by the fake collection of a rank
(:mod:`estimators.collect.fsdp`), real ranks on gloo
(:mod:`estimators.measure.real_fsdp`) and the user's own job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["FsdpSetup", "MIXED_PRECISION", "default_units", "shard_model", "unit_fqns"]

MIXED_PRECISION = ("bf16",)


@dataclass(frozen=True)
class FsdpSetup:
    """How to shard the collected step.

    ``world_size``: ranks; ``wrap``: class names of the modules to shard as
    units (the root is always one; None: the model's own list, a Hugging Face
    model's ``_no_split_modules``); ``mixed_precision``: None or ``"bf16"``
    (fp32 sharded parameters, bf16 gathered compute parameters, fp32 gradient
    reduction); ``reshard_after_forward``: free each unit's gathered
    parameters after its forward (FSDP2's default); ``sync_every_micro_batch``:
    with gradient accumulation, reduce the gradients after every micro-batch
    (FSDP2's default), or, False, after the last only
    (``set_requires_gradient_sync(False)`` before the others: each unit keeps
    its unsharded gradients until then).
    """

    world_size: int
    wrap: tuple[str, ...] | None = None
    mixed_precision: str | None = None
    reshard_after_forward: bool = True
    sync_every_micro_batch: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"fsdp_world_size must be a positive integer, got {self.world_size!r}")
        if self.mixed_precision is not None and self.mixed_precision not in MIXED_PRECISION:
            raise ValueError(f"mixed_precision must be one of {', '.join(MIXED_PRECISION)} or None, "
                             f"got {self.mixed_precision!r}")
        if self.wrap is not None:
            if isinstance(self.wrap, str):
                raise ValueError(f"fsdp_wrap must be a list of class names, got the string {self.wrap!r}")
            object.__setattr__(self, "wrap", tuple(self.wrap))

    def mp_policy(self) -> Any:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if self.mixed_precision == "bf16":
            return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        return MixedPrecisionPolicy()


def default_units(model: nn.Module) -> tuple[str, ...]:
    """The class names FSDP2 recipes shard: a Hugging Face model's ``_no_split_modules``; else a clear error."""
    names = getattr(model, "_no_split_modules", None)
    if not names:
        raise ValueError(f"{type(model).__name__} names no FSDP units (no _no_split_modules): give the classes to "
                         f"shard, --fsdp-wrap CLASS (repeatable), e.g. its transformer block")
    return tuple(names)


def unit_fqns(model: nn.Module, wrap: Sequence[str], fqns: dict[nn.Module, str]) -> list[str]:
    """fqns of the modules to shard: those of the ``wrap`` classes (outermost only) in pre-order, the root last."""
    present = {type(m).__name__ for m in model.modules()}
    for k, name in enumerate(wrap):
        if name not in present:
            raise ValueError(f"fsdp_wrap[{k}] {name!r} is no class of the model's modules (its classes: "
                             f"{', '.join(sorted(present))[:600]})")
    units: list[str] = []
    for mod in model.modules():
        fqn = fqns[mod]
        if mod is not model and type(mod).__name__ in wrap and not any(fqn.startswith(u + ".") for u in units):
            units.append(fqn)
    return units + [fqns[model]]


def shard_model(model: nn.Module, setup: FsdpSetup, mesh: Any, units: Sequence[str],
                fqns: dict[nn.Module, str]) -> None:
    """``fully_shard`` each unit, then the root (``units`` ends with it; the collector runs this under its FakeTensorMode).

    Real ranks on gloo also need :func:`estimators.shard` (it settles gloo's
    collectives, so a CPU rank holds memory in FSDP2's program order).
    """
    from torch.distributed.fsdp import fully_shard

    by_fqn = {fqn: mod for mod, fqn in fqns.items()}
    for fqn in units:  # disjoint units (outermost only), the root last: as torchtitan's apply_fsdp does
        fully_shard(by_fqn[fqn], mesh=mesh, mp_policy=setup.mp_policy(),
                    reshard_after_forward=setup.reshard_after_forward)

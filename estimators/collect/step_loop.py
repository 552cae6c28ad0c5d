"""The training loop around the fake step: the optimizer asked for, the micro-batches, what the stats record of them.

The loop itself is :class:`estimators.common.TrainingLoop`, shared with the
real steps; here is what only collecting needs: checking the optimizer before
anything runs, fresh module records for the micro-batches after the first,
stand-in values for the scalars an optimizer step reads (a fake tensor has no
value) and the metadata that records the loop.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException

from estimators.collect.fake_step import COMPILE_BACKENDS
from estimators.common import OPTIMIZER_NAMES, TrainingLoop, optimizer_class
from planner import StatsMetadata

__all__ = ["check_step_options", "describe_loop", "is_cached_cast", "optimizer_name", "optimizer_spec", "scalar_stand_in", "scratch_ops", "scratch_records"]


def optimizer_spec(optimizer: str | Callable[..., Any], kwargs: dict[str, Any] | None) -> None:
    """ValueError naming what is wrong with the optimizer asked for: an unknown name, an unimportable class path,
    a class that is no optimizer, arguments that are not JSON (the stats record them) or given to ``none``."""
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ValueError(f"optimizer_kwargs must be a dict of arguments, got {type(kwargs).__name__}")
    if callable(optimizer) and not isinstance(optimizer, str):
        if kwargs:
            raise ValueError("optimizer_kwargs go with an optimizer name or class path; an optimizer_fn(params) "
                             "builds the optimizer itself")
        return
    if not isinstance(optimizer, str):
        raise ValueError(f"optimizer must be a name, a dotted class path or optimizer_fn(params), got {optimizer!r}")
    if optimizer == "none":
        if kwargs:
            raise ValueError(f"optimizer 'none' takes no optimizer_kwargs, got {kwargs!r}")
        return
    optimizer_class(optimizer)
    try:
        json.dumps(kwargs or {}, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"optimizer_kwargs {kwargs!r} must be JSON values (the stats record them): {exc}") from None


def optimizer_name(optimizer: str | Callable[..., Any], built: torch.optim.Optimizer | None = None) -> str:
    """What ``metadata.optimizer`` says: the name or class path asked for, or the class ``optimizer_fn`` built."""
    if isinstance(optimizer, str):
        return optimizer
    if built is not None:
        return f"{type(built).__module__}.{type(built).__qualname__}"
    return getattr(optimizer, "__qualname__", "optimizer_fn")


def describe_loop(metadata: StatsMetadata, optimizer: str | Callable[..., Any], kwargs: dict[str, Any] | None,
                  loop: TrainingLoop) -> StatsMetadata:
    """``metadata`` with the loop recorded; nothing is added for the plain loop (one micro-batch, no autocast,
    scaler or clipping) and a built-in optimizer without arguments, so such stats keep their text and hash."""
    update: dict[str, Any] = {}
    if metadata.optimizer is None and isinstance(optimizer, str) and optimizer not in (*OPTIMIZER_NAMES, "none"):
        update["optimizer"] = optimizer  # a class path (an optimizer_fn's class is known once it ran)
    if kwargs:
        update["optimizer_kwargs"] = json.loads(json.dumps(kwargs))  # tuples (betas) as lists
    if loop.grad_accumulation > 1:
        update["grad_accumulation"] = loop.grad_accumulation
    if loop.max_grad_norm is not None:
        update["max_grad_norm"] = float(loop.max_grad_norm)
    if loop.grad_scaler:
        update["grad_scaler"] = True
    if loop.autocast is not None:
        update["model_settings"] = {**metadata.model_settings, "autocast": loop.autocast}
    return metadata.model_copy(update=update) if update else metadata


def scalar_stand_in(local_scalar_dense: Any, t: torch.Tensor) -> bool | int | float:
    """The value an optimizer step reads from a fake scalar (``.item()``, ``bool()``): fake mode's own where it
    knows one (a step count made from a constant), else zero.

    What a zero steers is not memory: a GradScaler's found-inf count (zero:
    the step runs, as in every step without an overflow), Adafactor's
    comparison of a parameter's RMS with its floor.
    """
    try:
        return local_scalar_dense(t)
    except DataDependentOutputException:  # fake mode's refusal (the MoE routing's values go through input_values)
        pass
    if t.dtype == torch.bool:
        return False
    return 0.0 if t.is_floating_point() else 0


def scratch_records(mods: dict) -> dict:
    """Fresh module records, as the collector made the first ones, for a micro-batch after the first."""
    return {mod: type(m)(m.fqn, m.parent, m.is_leaf) for mod, m in mods.items()}


@contextmanager
def scratch_ops(col: Any) -> Iterator[None]:
    """A micro-batch after the first: the collector's ops and saved tensors recorded apart, then dropped."""
    kept = col.ops, col.saved
    col.ops, col.saved = [], set()
    try:
        yield
    finally:
        col.ops, col.saved = kept


def is_cached_cast(func: Any, args: tuple, out: Any) -> bool:
    """Whether an op run under autocast is its cast of a parameter (an fp32 leaf that requires grad), which
    autocast's cache keeps until the outermost autocast region exits, whatever checkpointing discards.

    Such a cast is made once per region however many ops use the parameter;
    autograd saves it wherever an op needs the weight for backward. A plan
    cannot free it during the forward, so the stats count it as kept
    (``output_bytes`` 0, out of the module's activation bytes): saved, it is
    the tensor the step without checkpointing keeps too.
    """
    if func is not torch.ops.aten._to_copy.default or not args or not isinstance(args[0], torch.Tensor):
        return False
    x = args[0]
    return (x.is_leaf and x.requires_grad and x.dtype == torch.float32 and isinstance(out, torch.Tensor)
            and out.dtype in (torch.bfloat16, torch.float16) and torch.is_autocast_cache_enabled())


def check_step_options(optimizer: Any, optimizer_kwargs: dict[str, Any] | None, autocast: str | None, fsdp: Any,
                       dtype: torch.dtype | None, compile_backend: str | None) -> None:
    """ValueError naming the option for a step that cannot be collected as asked."""
    optimizer_spec(optimizer, optimizer_kwargs)  # a bad name, class path or argument
    if fsdp is not None and fsdp.mixed_precision and autocast is not None:
        raise ValueError(f"autocast {autocast!r} and FSDP2 mixed_precision {fsdp.mixed_precision!r} both cast the "
                         f"compute: use one of them")
    if fsdp is not None and fsdp.mixed_precision and dtype not in (None, torch.float32):
        raise ValueError(f"mixed_precision {fsdp.mixed_precision!r} keeps fp32 sharded parameters and casts them "
                         f"itself: dtype must be None or torch.float32, got {dtype}")
    if compile_backend is not None and compile_backend not in COMPILE_BACKENDS:
        raise ValueError(f"compile_backend must be one of {', '.join(COMPILE_BACKENDS)} or None, "
                         f"got {compile_backend!r}")
    if compile_backend is not None and fsdp is not None:
        raise ValueError(f"compile_backend {compile_backend!r} with fsdp: a compiled FSDP2 step is not collected "
                         f"yet; collect without one of them")

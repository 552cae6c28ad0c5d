"""How the training loop runs a step, beyond the model: micro-batches, autocast, a GradScaler, gradient clipping.

One description (:class:`TrainingLoop`) shared by the fake step the collector
runs, the real steps :func:`estimators.measure_steps` measures and the
stats' metadata, so a plan is made for, and held to, the loop the user runs:

    optimizer.zero_grad(set_to_none=True)
    for micro_batch in range(grad_accumulation):
        with torch.autocast(device_type, dtype=autocast):   # when autocast is set
            loss = loss_fn(model(**batch))
        (scaler.scale(loss) if scaler else loss).backward()
    if scaler and max_grad_norm: scaler.unscale_(optimizer)
    if max_grad_norm: torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    scaler.step(optimizer); scaler.update()   # or optimizer.step()
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["AUTOCAST_DTYPES", "TrainingLoop", "autocast_name"]

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class TrainingLoop:
    """The loop around the model: ``grad_accumulation`` micro-batches per optimizer step, forward and loss under
    ``autocast`` (``bf16``/``fp16``, None: off), fp16 gradients scaled by a ``GradScaler`` (``grad_scaler``),
    gradients clipped to ``max_grad_norm`` (None: not clipped) before the optimizer step."""

    grad_accumulation: int = 1
    autocast: str | None = None
    grad_scaler: bool = False
    max_grad_norm: float | None = None

    def __post_init__(self) -> None:
        n = self.grad_accumulation
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"grad_accumulation must be a positive integer, got {n!r}")
        if self.autocast is not None and self.autocast not in AUTOCAST_DTYPES:
            raise ValueError(f"autocast must be one of {', '.join(AUTOCAST_DTYPES)} or None, got {self.autocast!r}")
        if self.max_grad_norm is not None and not (isinstance(self.max_grad_norm, (int, float))
                                                   and self.max_grad_norm > 0):
            raise ValueError(f"max_grad_norm must be a positive number or None, got {self.max_grad_norm!r}")

    @property
    def plain(self) -> bool:
        """One micro-batch, no autocast, no scaler, no clipping: the step as sacplan always collected it."""
        return self == TrainingLoop()

    def autocast_context(self, device_type: str) -> Any:
        """``torch.autocast`` for the forward and loss, or a no-op."""
        if self.autocast is None:
            return nullcontext()
        return torch.autocast(device_type, dtype=AUTOCAST_DTYPES[self.autocast])

    def grad_scaler_for(self, device_type: str) -> Any:
        """A new ``torch.amp.GradScaler`` when the loop scales gradients, else None."""
        return torch.amp.GradScaler(device_type) if self.grad_scaler else None

    def optimizer_step(self, optimizer: torch.optim.Optimizer | None, params: list[nn.Parameter],
                       scaler: Any = None) -> None:
        """What follows the last micro-batch's backward: unscale (with a scaler and clipping), clip, step."""
        if scaler is not None and optimizer is not None and self.max_grad_norm is not None:
            scaler.unscale_(optimizer)  # clipping reads true gradients
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        if optimizer is None:
            return
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()


def autocast_name(device_type: str) -> str | None:
    """The stats' name of the autocast dtype in effect for ``device_type`` (``bf16``, ``fp16``), or None: off."""
    if not torch.is_autocast_enabled(device_type):
        return None
    dtype = torch.get_autocast_dtype(device_type)
    return next((name for name, d in AUTOCAST_DTYPES.items() if d == dtype), str(dtype))

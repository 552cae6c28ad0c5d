"""A recomputation leaves the module's buffers as the forward left them.

A checkpointed module's forward runs twice: once in the forward, once when
its backward recomputes it. Whatever the forward does to a buffer in place
happens twice unless stopped: BatchNorm's running mean and variance move
again (by the recomputation's batch statistics, which are the same: the
update is applied twice) and ``num_batches_tracked`` counts the batch
twice. Gradients are equal, so nothing warns; training silently changes.

:class:`RecomputeBufferGuard`, a dispatch mode under the selective-checkpoint
cache during the recomputation only, stops every update of the module's
buffers there, so the parameters, gradients and buffers after a step are
bit-identical to the step without the plan:

* an in-place op (or an ``out=`` op) writing a buffer is not run; it
  returns the buffer as it is;
* batch norm's kernels update the running statistics they are given
  without saying so in their schema; in a recomputation they run with
  ``momentum`` 0, which leaves each running statistic exactly as it is
  (``(1 - 0) * r + 0 * batch``), and with the same inputs, outputs and
  saved tensors as in the forward, so the memory is the plan's.

A recomputation reads a buffer's value after the forward's update: the
value the forward used when it updated the buffer before reading it
(BatchNorm's training mode reads no running statistic at all).
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

from estimators.common import written_tensors

__all__ = ["RecomputeBufferGuard", "guarded_recompute"]

aten = torch.ops.aten
# batch norm kernels that update their running statistics in place, and the position of their momentum argument
_MOMENTUM_AT = {
    aten.native_batch_norm.default: 6,
    aten._native_batch_norm_legit.default: 6,  # layout: allow-private (an ATen op's name)
    aten._native_batch_norm_legit_functional.default: 6,  # layout: allow-private (an ATen op's name)
    aten._batch_norm_with_update.default: 5,  # layout: allow-private (an ATen op's name)
    aten.cudnn_batch_norm.default: 6,
    aten.miopen_batch_norm.default: 6,
}


def _storage_key(t: torch.Tensor) -> int:
    """The address of the data ``t`` holds; a wrapper subclass's (a DTensor buffer, as torchtitan's RoPE cache under
    TP; an AsyncCollectiveTensor this mode meets before its dispatch) is its first inner tensor's: the wrapper's own
    storage is a placeholder with no data pointer."""
    if is_traceable_wrapper_subclass(t):
        inner, _ = t.__tensor_flatten__()
        return _storage_key(getattr(t, inner[0]))
    return t.untyped_storage().data_ptr()


class RecomputeBufferGuard(TorchDispatchMode):
    """Stops in-place updates of ``module``'s buffers during a recomputation (see the module doc)."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.buffers = {_storage_key(b) for b in module.buffers() if b.layout == torch.strided and b.numel()}
        self.skipped = 0

    def _is_buffer(self, x: Any) -> bool:
        return isinstance(x, torch.Tensor) and x.layout == torch.strided and _storage_key(x) in self.buffers

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        at = _MOMENTUM_AT.get(func)
        if at is not None and len(args) > at and any(self._is_buffer(a) for a in args[3:5]):
            self.skipped += 1
            return func(*args[:at], 0.0, *args[at + 1:], **kwargs)
        written = written_tensors(func, args, kwargs)
        if written and all(self._is_buffer(w) for w in written):
            self.skipped += 1
            return written[0] if len(written) == 1 else tuple(written)
        return func(*args, **kwargs)


def guarded_recompute(module: nn.Module, recompute_ctx: Any) -> Any:
    """``recompute_ctx`` (the selective-checkpoint cache) with the guard under it, for a module with buffers."""
    if not any(True for _ in module.buffers()):
        return recompute_ctx

    @contextmanager
    def guarded() -> Any:
        with ExitStack() as stack:
            stack.enter_context(RecomputeBufferGuard(module))  # first: under the cache, so the policy sees each op
            stack.enter_context(recompute_ctx)
            yield

    return guarded()

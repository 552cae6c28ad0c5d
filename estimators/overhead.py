"""What checkpointing a module costs beyond recomputing its ops.

``torch.utils.checkpoint`` re-runs a checkpointed module's Python forward in
backward, and under a selective policy it calls the policy for every op,
saved or not, and caches what the policy saves. None of that is an op's
runtime, so the planner's recompute time (the runtimes of the recomputed ops)
does not hold it: the stats carry it per module (``checkpoint_overhead_ms``).

Measured: the module's forward+backward on real tensors of the collected
shapes, plain and under a policy that saves every op (so nothing is
recomputed and the difference is that cost alone), runs interleaved, the
fastest of each subtracted (the run least disturbed by other work: medians
of a few runs swing by the whole figure on a shared machine), floored at 0. Estimated: the module's op count times a per-op
figure of the device table (:class:`estimators.devices.DeviceSpec`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from estimators.cost_model import elapsed_ms, real_tensor
from estimators.tracking import tensors_in

__all__ = ["TensorSpec", "call_spec", "measure_checkpoint_overhead_ms", "fill_checkpoint_overheads"]

# Argument values a replayed call keeps; any other object (a KV cache, a mask object) is replayed as None,
# since keeping it would keep the fake step's tensors alive and replaying it may carry state between runs.
_PLAIN = (type(None), bool, int, float, str, torch.dtype, torch.device)


@dataclass(frozen=True)
class TensorSpec:
    """A tensor argument of a module call, without its data: what a real one is made like."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool


def call_spec(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A module call's arguments with every tensor replaced by its :class:`TensorSpec`."""

    def spec(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return TensorSpec(tuple(x.shape), tuple(x.stride()), x.dtype, x.requires_grad)
        return x if isinstance(x, _PLAIN) else None

    return tree_map(spec, (args, kwargs))


def _real_call(spec: tuple[tuple, dict], device: torch.device) -> tuple[tuple, dict]:
    def real(x: Any) -> Any:
        if isinstance(x, TensorSpec):
            return real_tensor(x.shape, x.stride, x.dtype, device, requires_grad=x.requires_grad)
        return x

    return tree_map(real, spec)


def _materialize(module: nn.Module, device: torch.device, dtype: torch.dtype | None) -> nn.Module:
    """A real copy of ``module`` (which may live on ``meta``) on ``device``, random weights."""
    real = copy.deepcopy(module).to_empty(device=device)
    if dtype is not None:
        real = real.to(dtype=dtype)
    with torch.no_grad():
        for t in (*real.parameters(), *real.buffers()):
            if t.is_floating_point():
                t.uniform_(-0.05, 0.05)
            elif t.dtype == torch.bool:
                t.fill_(True)
            else:
                t.zero_()
    return real


def _save_every_op(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE


def measure_checkpoint_overhead_ms(module: nn.Module, args: tuple, kwargs: dict, *, device: torch.device,
                                   warmup: int = 1, repeat: int = 7) -> float:
    """Fastest ms of ``module``'s forward+backward under checkpointing (every op saved) minus plain; at least 0."""
    leaves = [p for p in module.parameters() if p.requires_grad] + [t for t in tensors_in((args, kwargs))
                                                                    if t.requires_grad]
    # as apply_plan runs a plan: an in-place op may mutate a saved output
    context = partial(create_selective_checkpoint_contexts, _save_every_op, allow_cache_entry_mutation=True)

    def plain() -> Any:
        return module(*args, **kwargs)

    def checkpointed() -> Any:
        return checkpoint(module, *args, use_reentrant=False, context_fn=context, **kwargs)

    def step(forward: Callable[[], Any]) -> None:
        outs = [t for t in tensors_in(forward()) if t.requires_grad]
        if outs:
            torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
        for t in leaves:
            t.grad = None

    times: dict[Any, list[float]] = {plain: [], checkpointed: []}
    for k in range(warmup + repeat):
        for forward, runs in times.items():  # interleaved: a shared machine's drift hits both alike
            ms = elapsed_ms(partial(step, forward), device)
            if k >= warmup:
                runs.append(ms)
    return max(0.0, min(times[checkpointed]) - min(times[plain]))


def fill_checkpoint_overheads(stats: Any, modules: dict[str, nn.Module], calls: dict[str, tuple], *,
                              us_per_op: float | None, measure: bool, device: torch.device,
                              dtype: torch.dtype | None, progress: Callable[[str, int, int], None] | None = None
                              ) -> None:
    """Set ``checkpoint_overhead_ms`` of every module of ``stats`` with an op list: measured, else estimated.

    With ``measure``, a module whose call was captured (``calls``: fqn ->
    :func:`call_spec`) is measured once per (class, op names, call) and the
    figure reused for its repeats; one that cannot run alone gets the
    estimate, its op count times ``us_per_op`` (none without it). How the
    figures were made goes to ``stats.metadata.tags['checkpoint_overhead']``.
    ``progress(phase, done, total)`` is told of each module measured.
    """
    seen: dict[Any, float | None] = {}
    measured = estimated = 0
    with_ops = [m for m in stats.modules if m.ops is not None]
    for done, m in enumerate(with_ops, 1):
        ms, spec = None, calls.get(m.fqn)
        if measure and spec is not None:
            key = (type(modules[m.fqn]), tuple(op.name for op in m.ops), repr(spec))
            if key not in seen:
                seen[key] = _try_measure(modules[m.fqn], spec, device, dtype)
                if progress:
                    progress("overhead", done, len(with_ops))
            ms = seen[key]
            measured += ms is not None
        if ms is None and us_per_op is not None:
            ms = len(m.ops) * us_per_op / 1e3
            estimated += 1
        m.checkpoint_overhead_ms = ms
    distinct = sum(ms is not None for ms in seen.values())
    how = [f"measured on {device.type}: {measured} modules ({distinct} distinct)"] if measure else []
    if estimated:
        how.append(f"estimated: {estimated} modules at {us_per_op:g} us per op")
    stats.metadata.tags["checkpoint_overhead"] = "; ".join(how) or "not known"


def _try_measure(module: nn.Module, spec: tuple, device: torch.device, dtype: torch.dtype | None) -> float | None:
    try:
        real = _materialize(module, device, dtype)
        args, kwargs = _real_call(spec, device)
        return measure_checkpoint_overhead_ms(real, args, kwargs, device=device)
    except Exception:  # noqa: BLE001 - a module that cannot run alone keeps the estimate
        return None

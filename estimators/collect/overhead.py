"""What checkpointing a module costs beyond recomputing its ops.

``torch.utils.checkpoint`` re-runs a checkpointed module's Python forward in
backward, and under a selective policy it calls the policy for every op in
forward and caches what the policy saves, handing it back in the recompute.
None of that is an op's runtime, so the planner's recompute time (the
runtimes of the recomputed ops) does not hold it: the stats carry it per
module, ``checkpoint_overhead_ms`` (the cost with every op saved) and
``saved_op_overhead_ms`` (what saving an op costs over recomputing it,
beyond its runtime: a recomputed op costs its runtime less this).

Measured: the module's forward+backward on real tensors of the collected
shapes, plain, with every op saved and with every op recomputed, runs
interleaved, medians of process CPU time on one thread (see
:func:`estimators.collect.cost_model.elapsed_ms`). Estimated: the module's op count
times a per-op figure of the device table
(:class:`estimators.collect.devices.DeviceSpec`), and nothing per saved op.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from estimators.collect.cost_model import elapsed_ms, real_tensor
from estimators.common import is_random_op, op_name, tensors_in

__all__ = ["TensorSpec", "call_spec", "Overhead", "measure_checkpoint_overhead", "fill_checkpoint_overheads"]

_MIN_ROUNDS = 3  # timed rounds of a module however long its runs take
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


@dataclass(frozen=True)
class Overhead:
    """What checkpointing one module costs beyond its ops' runtimes (ms, see :func:`measure_checkpoint_overhead`)."""

    every_saved_ms: float  # checkpointed with every op but views saved, less plain: nothing is recomputed
    per_saved_op_ms: float  # what saving an op costs over recomputing it, beyond its runtime


class _ListPolicy:
    """A save list applied op by op, doing per op what :func:`estimators.apply_plan`'s policy does (it looks
    up the op's name and whether it draws random numbers), so the measured cost includes that work."""

    def __init__(self, save: list[int]):
        self.save, self.count = save, 0

    def __call__(self, ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        k = self.count
        self.count += 1
        op_name(func), is_random_op(func, args, kwargs)
        saved = self.save[k] if k < len(self.save) else 0
        return CheckpointPolicy.MUST_SAVE if saved else CheckpointPolicy.PREFER_RECOMPUTE


def measure_checkpoint_overhead(module: nn.Module, args: tuple, kwargs: dict, ops: list[Any],
                                recompute_op_count: int | None = None, *, device: torch.device, warmup: int = 1,
                                repeat: int = 7, max_seconds: float | None = 60.0) -> Overhead:
    """``module``'s forward+backward plain, checkpointed saving every op but views, and recomputing every op.

    Runs interleaved (a shared machine's drift hits all three alike), each
    timed by :func:`estimators.collect.cost_model.elapsed_ms`, medians; ``repeat``
    rounds, or as many as fit in ``max_seconds`` by the first round's time
    (at least 3): a module spanning a large model takes seconds a run. ``ops``: the
    module's ops in the stats (``view_like``, ``runtime_ms``), of which a
    recompute re-runs the first ``recompute_op_count`` (None: all).
    Recomputing every op costs ``every_saved_ms`` plus the runtimes of the
    ops re-run less one ``per_saved_op_ms`` per op not saved: that gives the
    latter (at least 0).
    """
    leaves = [p for p in module.parameters() if p.requires_grad] + [t for t in tensors_in((args, kwargs))
                                                                    if t.requires_grad]
    every = [0 if op.view_like else 1 for op in ops]

    def plain() -> Any:
        return module(*args, **kwargs)

    def checkpointed(save: list[int]) -> Callable[[], Any]:
        def run() -> Any:
            # as apply_plan runs a plan: an in-place op may mutate a saved output
            context = partial(create_selective_checkpoint_contexts, _ListPolicy(save), allow_cache_entry_mutation=True)
            return checkpoint(module, *args, use_reentrant=False, context_fn=context, **kwargs)
        return run

    def step(forward: Callable[[], Any]) -> None:
        outs = [t for t in tensors_in(forward()) if t.requires_grad]
        if outs:
            torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
        for t in leaves:
            t.grad = None

    runs = {"plain": plain, "saved": checkpointed(every), "recomputed": checkpointed([0] * len(ops))}
    times: dict[str, list[float]] = {k: [] for k in runs}
    rounds, k = warmup + repeat, 0
    while k < rounds:
        round_ms = 0.0
        for name, forward in runs.items():
            ms = elapsed_ms(partial(step, forward), device)
            round_ms += ms
            if k >= warmup:
                times[name].append(ms)
        if k == 0 and max_seconds is not None and round_ms > 0:
            rounds = warmup + max(min(repeat, _MIN_ROUNDS), min(repeat, int(max_seconds * 1e3 / round_ms)))
        k += 1
    med = {k: statistics.median(v) for k, v in times.items()}
    every_saved = max(0.0, med["saved"] - med["plain"])
    recompute_ms = math.fsum(op.runtime_ms for op in ops[:recompute_op_count])
    n = sum(every)
    per_op = (every_saved + recompute_ms - (med["recomputed"] - med["plain"])) / n if n else 0.0
    return Overhead(every_saved, max(0.0, per_op))


def fill_checkpoint_overheads(stats: Any, modules: dict[str, nn.Module], calls: dict[str, tuple], *,
                              us_per_op: float | None, measure: bool, device: torch.device,
                              dtype: torch.dtype | None, progress: Callable[[str, int, int], None] | None = None
                              ) -> None:
    """Set ``checkpoint_overhead_ms`` of every module of ``stats`` with an op list: measured, else estimated.

    With ``measure``, a module whose call was captured (``calls``: fqn ->
    :func:`call_spec`) is measured once per (class, op names, call) and the
    figure reused for its repeats; one that cannot run alone gets the
    estimate, its op count times ``us_per_op`` (none without it), and so does
    the root, which no plan checkpoints (measuring it runs the whole model
    24 times: minutes on a large MoE). How the
    figures were made goes to ``stats.metadata.tags['checkpoint_overhead']``.
    ``progress(phase, done, total)`` is told of each module measured.
    """
    seen: dict[Any, Overhead | None] = {}
    measured = estimated = 0
    with_ops = [m for m in stats.modules if m.ops is not None]
    root = stats.fw_post_order[-1]
    for done, m in enumerate(with_ops, 1):
        got, spec = None, calls.get(m.fqn)
        if measure and spec is not None and m.fqn != root:
            key = (type(modules[m.fqn]), tuple(op.name for op in m.ops), m.recompute_op_count, repr(spec))
            if key not in seen:
                seen[key] = _try_measure(modules[m.fqn], spec, m, device, dtype)
                if progress:
                    progress("overhead", done, len(with_ops))
            got = seen[key]
            measured += got is not None
        if got is not None:
            m.checkpoint_overhead_ms, m.saved_op_overhead_ms = got.every_saved_ms, got.per_saved_op_ms
        elif us_per_op is not None:
            m.checkpoint_overhead_ms = len(m.ops) * us_per_op / 1e3
            estimated += 1
    distinct = sum(got is not None for got in seen.values())
    how = [f"measured on {device.type}: {measured} modules ({distinct} distinct), not the root"] if measure else []
    if estimated:
        how.append(f"estimated: {estimated} modules at {us_per_op:g} us per op")
    stats.metadata.tags["checkpoint_overhead"] = "; ".join(how) or "not known"


def _try_measure(module: nn.Module, spec: tuple, stats: Any, device: torch.device,
                 dtype: torch.dtype | None) -> Overhead | None:
    try:
        real = _materialize(module, device, dtype)
        args, kwargs = _real_call(spec, device)
        return measure_checkpoint_overhead(real, args, kwargs, stats.ops, stats.recompute_op_count, device=device)
    except Exception:  # noqa: BLE001 - a module that cannot run alone keeps the estimate
        return None

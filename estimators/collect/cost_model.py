"""Per-op runtime: a roofline over a device's datasheet figures, or real timings on the collection device.

FLOPs come from the formulas registered in ``torch.utils.flop_counter``
(matmuls, convolutions, attention); every other op is treated as memory bound.
Bytes moved are the bytes of the op's tensor inputs plus its outputs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from estimators.collect.devices import DeviceSpec
from estimators.common import is_view_op

__all__ = ["op_flops", "op_bytes_moved", "RooflineCostModel", "BenchmarkCostModel", "dtype_name", "real_tensor",
           "elapsed_ms"]

_DTYPE_NAMES = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float64: "fp64",
}


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def op_flops(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """FLOPs of one op from PyTorch's registered formula; 0 if it has none."""
    formula = flop_registry.get(func.overloadpacket)
    if formula is None:
        return 0
    return int(formula(*args, **kwargs, out_val=out))


def _tensors(tree: Any) -> list[torch.Tensor]:
    flat, _ = tree_flatten(tree)
    return [t for t in flat if isinstance(t, torch.Tensor)]


def op_bytes_moved(args: tuple, kwargs: dict, out: Any) -> int:
    """Bytes the op reads (tensor inputs) and writes (outputs)."""
    total = 0
    for t in _tensors((args, kwargs)) + _tensors(out):
        total += t.numel() * t.element_size()
    return total


class RooflineCostModel:
    """max(compute time, memory time) on a device's peak figures."""

    def __init__(self, device: DeviceSpec, *, allow_tf32: bool = False):
        self.device = device
        self.allow_tf32 = allow_tf32

    def __call__(self, func: Any, args: tuple, kwargs: dict, out: Any) -> float:
        """Runtime of the op in milliseconds."""
        if is_view_op(func):
            return 0.0
        flops = op_flops(func, args, kwargs, out)
        nbytes = op_bytes_moved(args, kwargs, out)
        d = self.device
        compute_s = 0.0
        if flops:
            inputs = _tensors(args)
            dt = dtype_name(inputs[0].dtype) if inputs else "fp32"
            if dt == "fp32" and self.allow_tf32:
                dt = "tf32"
            compute_s = flops / (d.tflops(dt) * 1e12 * d.compute_efficiency)
        memory_s = nbytes / (d.mem_bandwidth_gbps * 1e9 * d.memory_efficiency)
        return max(compute_s, memory_s) * 1e3


class BenchmarkCostModel:
    """Times each distinct op for real on the collection device, CPU or CUDA, one code path for both.

    Fake inputs are replaced by real tensors of the same shape, dtype and
    strides on ``device`` (see :func:`real_tensor`); the op runs ``warmup``
    times, then ``repeat`` times each timed alone (:func:`elapsed_ms`), and
    the median is cached per signature (op, shapes, strides, dtypes, other
    arguments). Falls back to ``fallback`` for ops that fail to run for real.
    ``device`` defaults to CUDA, what this class timed before it took others.
    """

    def __init__(self, fallback: Callable[..., float], *, device: str | torch.device = "cuda", warmup: int = 2,
                 repeat: int = 5):
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("--benchmark needs a CUDA device, and torch.cuda.is_available() is False")
        self.fallback = fallback
        self.warmup = warmup
        self.repeat = repeat
        self._cache: dict[Any, float] = {}

    def __call__(self, func: Any, args: tuple, kwargs: dict, out: Any) -> float:
        if is_view_op(func):
            return 0.0
        key = (func, _signature(args), _signature(kwargs))
        if key not in self._cache:
            try:
                self._cache[key] = self._time(func, args, kwargs)
            except Exception:  # noqa: BLE001 - an op that cannot run alone keeps its roofline estimate
                self._cache[key] = self.fallback(func, args, kwargs, out)
        return self._cache[key]

    def _time(self, func: Any, args: tuple, kwargs: dict) -> float:
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        from torch.utils._pytree import tree_map

        def real(x: Any) -> Any:
            return real_tensor(x.shape, x.stride(), x.dtype, self.device) if isinstance(x, torch.Tensor) else x

        with unset_fake_temporarily(), torch.no_grad():
            r_args, r_kwargs = tree_map(real, (args, kwargs))
            for _ in range(self.warmup):
                func(*r_args, **r_kwargs)
            return statistics.median(
                elapsed_ms(lambda: func(*r_args, **r_kwargs), self.device) for _ in range(self.repeat)
            )


def real_tensor(shape: Sequence[int], stride: Sequence[int], dtype: torch.dtype, device: torch.device, *,
                requires_grad: bool = False) -> torch.Tensor:
    """A real tensor to time kernels on: random floats in [-1, 1], integers 0, booleans True."""
    t = torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype, device=device)
    if t.is_floating_point() or t.is_complex():
        t.uniform_(-1, 1)
    elif dtype == torch.bool:
        t.fill_(True)
    else:
        t.zero_()
    return t.requires_grad_(requires_grad)


def elapsed_ms(run: Callable[[], Any], device: torch.device) -> float:
    """Milliseconds of one ``run()``: CUDA events around the work on CUDA; on a CPU, process CPU time when
    torch runs on one thread, else ``time.perf_counter``.

    The clock is the only part that depends on the device: a CUDA run is
    asynchronous, so its events time the device's work, not the launch. On
    one thread the CPU time is the work's own, whatever else the machine runs
    meanwhile (a shared machine's other processes inflate wall time); on
    several it would add the threads up, so wall time it is.
    """
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    clock = time.process_time if torch.get_num_threads() == 1 else time.perf_counter
    start_s = clock()
    run()
    return (clock() - start_s) * 1e3


def _signature(tree: Any) -> tuple:
    flat, _ = tree_flatten(tree)
    return tuple(
        (tuple(x.shape), tuple(x.stride()), x.dtype) if isinstance(x, torch.Tensor) else repr(x) for x in flat
    )

"""Per-op runtime: a roofline over a device's datasheet figures, or real timings.

FLOPs come from the formulas registered in ``torch.utils.flop_counter``
(matmuls, convolutions, attention); every other op is treated as memory bound.
Bytes moved are the bytes of the op's tensor inputs plus its outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from estimators.devices import DeviceSpec

__all__ = ["op_flops", "op_bytes_moved", "RooflineCostModel", "BenchmarkCostModel", "dtype_name"]

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
        if func.is_view or torch.Tag.inplace_view in func.tags:
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
    """Times each distinct op (by function and input shapes) on the real CUDA device.

    Fake inputs are replaced by real tensors of the same shape, dtype and
    strides (random floats, zeros for integers); results are cached per
    signature. Falls back to ``fallback`` for ops that fail to run for real.
    """

    def __init__(self, fallback: Callable[..., float], *, warmup: int = 2, repeat: int = 5):
        if not torch.cuda.is_available():
            raise RuntimeError("--benchmark needs a CUDA device, and torch.cuda.is_available() is False")
        self.fallback = fallback
        self.warmup = warmup
        self.repeat = repeat
        self._cache: dict[Any, float] = {}

    def __call__(self, func: Any, args: tuple, kwargs: dict, out: Any) -> float:
        if func.is_view or torch.Tag.inplace_view in func.tags:
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
            if not isinstance(x, torch.Tensor):
                return x
            t = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="cuda")
            if t.is_floating_point():
                t.uniform_(-1, 1)
            else:
                t.zero_()
            return t

        with unset_fake_temporarily():
            r_args, r_kwargs = tree_map(real, (args, kwargs))
            for _ in range(self.warmup):
                func(*r_args, **r_kwargs)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(self.repeat):
                func(*r_args, **r_kwargs)
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / self.repeat


def _signature(tree: Any) -> tuple:
    flat, _ = tree_flatten(tree)
    return tuple(
        (tuple(x.shape), tuple(x.stride()), x.dtype) if isinstance(x, torch.Tensor) else repr(x) for x in flat
    )

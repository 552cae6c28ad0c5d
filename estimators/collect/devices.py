"""Datasheet figures of training devices, for the roofline cost model.

Peak FLOP/s are dense (no structured sparsity) tensor-core figures per dtype;
``fp32`` is the non-tensor-core FP32 rate, which is what PyTorch uses for fp32
matmuls unless TF32 is enabled (``torch.backends.cuda.matmul.allow_tf32``).
Memory bandwidth is the HBM/GDDR peak. Sources, one per device:

* A100-40GB, A100-80GB: NVIDIA A100 Tensor Core GPU datasheet (SXM columns),
  https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
  BF16/FP16 312, TF32 156, FP32 19.5 TFLOP/s; 1,555 GB/s (40GB), 2,039 GB/s (80GB); 40 / 80 GB HBM2e.
* H100-SXM, H100-PCIe: NVIDIA H100 Tensor Core GPU datasheet,
  https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet
  SXM: BF16 1,979 / TF32 989 TFLOP/s *with sparsity* (dense: half), FP32 67, 3.35 TB/s, 80 GB;
  PCIe: BF16 1,513 / TF32 756 with sparsity (dense: half), FP32 51, 2 TB/s, 80 GB.
* H200: NVIDIA H200 Tensor Core GPU datasheet (SXM),
  https://resources.nvidia.com/en-us-data-center-overview-mc/en-us-data-center-overview/hpc-datasheet-sc23-h200
  same compute as H100-SXM, 4.8 TB/s, 141 GB.
* L40S: NVIDIA L40S datasheet,
  https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413
  BF16 733 / TF32 366 TFLOP/s with sparsity (dense: half), FP32 91.6, 864 GB/s, 48 GB.
* MI300X: AMD Instinct MI300X accelerator datasheet,
  https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf
  BF16/FP16 1,307.4, TF32 653.7, FP32 (matrix) 163.4 TFLOP/s; 5.3 TB/s, 192 GB.

Memory is the datasheet's figure in GB, read as 10**9 bytes (``memory_bytes``):
an H100's 80 GB are 74.5 GiB. That is the cautious reading: the CUDA runtime
reports somewhat more on most parts (79.6 GiB on an H100 80GB HBM3), but the
CUDA context, the caching allocator's fragmentation and communication buffers
take part of it, and none of them is in the stats.

Names are matched exactly (case-insensitive): ``h100`` is refused with the
entries it could mean (H100-SXM, H100-PCIe), never guessed. Only the names
``torch.cuda.get_device_name`` reports (``NVIDIA H100 80GB HBM3``) are mapped
to entries by pattern (:func:`cuda_device_entry`), each pattern naming one
part unambiguously.

``cpu`` is not a datasheet entry: a deliberately rough placeholder (1 TFLOP/s,
50 GB/s) for collecting on a CPU for a CPU run; pass ``--peak-tflops`` and
``--mem-bandwidth-gbps`` for a real figure.

Checkpoint overhead per op (what checkpointing a module costs beyond
recomputing its ops, per op of the module; see :mod:`estimators.collect.overhead`):
``cpu`` carries the median measured by ``bench/bench_checkpoint_overhead.py``
on the project's benchmark machine (bench/RESULTS.md, "Checkpoint overhead per
op"). It is host-side Python (the module's forward re-run, the policy called
for every op), so the GPU entries carry the same figure, not measured on a
GPU: where queued GPU work hides host time it adds less, so for them it is an
upper estimate. Override it with ``--checkpoint-overhead-us-per-op``.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, replace

__all__ = ["DeviceSpec", "DEVICES", "device_spec", "device_names", "cuda_device_entry", "CPU_CHECKPOINT_OVERHEAD_US"]


# bench/RESULTS.md, "Checkpoint overhead per op" (planner 0.6.1: a policy doing apply_plan's per-op work, medians
# of process CPU time): median over 14 modules 80.5 us (quartiles 67-95). Before (planner 0.5): 55 us, taken with a
# policy returning a constant, the fastest of 7 wall-clock runs, which left out the policy's ~22 us an op.
CPU_CHECKPOINT_OVERHEAD_US = 80.0
_MEASURED = ("measured on a 2-core AMD EPYC, torch 2.13, one thread (bench/bench_checkpoint_overhead.py, "
             "bench/RESULTS.md 'Checkpoint overhead per op'): median 80.5 us per op over 14 modules, with "
             "apply_plan's per-op policy work, rounded to 5 us")
_HOST_ESTIMATE = ("estimate, not measured on a GPU: the host-side cost measured on a CPU (" + _MEASURED
                  + "); an upper estimate where queued GPU work hides host time")


@dataclass(frozen=True)
class DeviceSpec:
    """Roofline figures of one device, and what checkpointing costs there per op beyond recomputing it."""

    name: str
    kind: str  # "cuda" (what a CUDA/ROCm build reports as device type) or "cpu"
    peak_tflops: dict[str, float]  # dtype name -> dense TFLOP/s
    mem_bandwidth_gbps: float  # GB/s (10**9 bytes per second)
    source: str
    compute_efficiency: float = 1.0  # fraction of peak FLOP/s reached
    memory_efficiency: float = 1.0  # fraction of peak bandwidth reached
    checkpoint_overhead_us_per_op: float = CPU_CHECKPOINT_OVERHEAD_US  # see the module docstring
    checkpoint_overhead_source: str = _HOST_ESTIMATE
    memory_gb: float | None = None  # datasheet memory in GB (10**9 bytes); None: not a device with a fixed memory

    @property
    def memory_bytes(self) -> int | None:
        """The datasheet memory in bytes (GB read as 10**9 bytes: see the module docstring), or None."""
        return None if self.memory_gb is None else int(self.memory_gb * 10**9)

    def tflops(self, dtype: str) -> float:
        """Peak dense TFLOP/s for a dtype name (fp32, tf32, bf16, fp16, ...)."""
        if dtype in self.peak_tflops:
            return self.peak_tflops[dtype]
        # Integer/fp8 and unknown dtypes: use the 16-bit tensor-core rate.
        return self.peak_tflops.get("bf16", max(self.peak_tflops.values()))


def _spec(name: str, bf16: float, tf32: float, fp32: float, gbps: float, memory_gb: float | None, source: str,
          kind: str = "cuda") -> DeviceSpec:
    return DeviceSpec(name, kind, {"bf16": bf16, "fp16": bf16, "tf32": tf32, "fp32": fp32, "fp64": fp32 / 2},
                      gbps, source, checkpoint_overhead_source=_MEASURED if kind == "cpu" else _HOST_ESTIMATE,
                      memory_gb=memory_gb)


_NV_A100 = "NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), SXM, dense"
_NV_H100 = "NVIDIA H100 Tensor Core GPU datasheet, dense (half the with-sparsity figures)"
DEVICES: dict[str, DeviceSpec] = {
    s.name.lower(): s
    for s in (
        _spec("A100-40GB", 312.0, 156.0, 19.5, 1555.0, 40, _NV_A100),
        _spec("A100-80GB", 312.0, 156.0, 19.5, 2039.0, 80, _NV_A100),
        _spec("H100-SXM", 989.5, 494.5, 67.0, 3350.0, 80, _NV_H100 + ", SXM5"),
        _spec("H100-PCIe", 756.5, 378.0, 51.0, 2000.0, 80, _NV_H100 + ", PCIe"),
        _spec("H200", 989.5, 494.5, 67.0, 4800.0, 141, "NVIDIA H200 Tensor Core GPU datasheet, SXM, dense"),
        _spec("L40S", 366.5, 183.0, 91.6, 864.0, 48, "NVIDIA L40S datasheet, dense (half the with-sparsity figures)"),
        _spec("MI300X", 1307.4, 653.7, 163.4, 5300.0, 192, "AMD Instinct MI300X data sheet, dense matrix"),
        _spec("cpu", 1.0, 1.0, 1.0, 50.0, None, "placeholder, not a datasheet figure: override it", kind="cpu"),
    )
}

# Names as torch.cuda.get_device_name reports them -> table entries; each pattern names one part
# (an H100 NVL, say, matches none and is refused rather than costed as another H100).
_CUDA_NAMES = (
    (r"a100.*80", "a100-80gb"),
    (r"a100.*40", "a100-40gb"),
    (r"h100.*pcie", "h100-pcie"),
    (r"h100.*(sxm|hbm3)", "h100-sxm"),
    (r"h200", "h200"),
    (r"l40s", "l40s"),
    (r"mi300x", "mi300x"),
)


def device_names() -> list[str]:
    """The table's device names, as printed."""
    return [s.name for s in DEVICES.values()]


def device_spec(
    name: str,
    *,
    peak_tflops: float | None = None,
    mem_bandwidth_gbps: float | None = None,
    compute_efficiency: float | None = None,
    memory_efficiency: float | None = None,
    checkpoint_overhead_us_per_op: float | None = None,
) -> DeviceSpec:
    """The table entry for ``name`` (case-insensitive), with user overrides.

    ``peak_tflops`` replaces the peak of every dtype. A name that is not an
    entry is refused (``ValueError`` naming the entries it could mean), never
    guessed; see :func:`cuda_device_entry` for the names CUDA reports.
    """
    spec = DEVICES.get(name.strip().lower())
    if spec is None:
        raise ValueError(_unknown_device(name))
    for field, value in (("peak_tflops", peak_tflops), ("mem_bandwidth_gbps", mem_bandwidth_gbps)):
        if value is not None and not value > 0:
            raise ValueError(f"{field} must be positive, got {value!r}")
    for field, value in (("compute_efficiency", compute_efficiency), ("memory_efficiency", memory_efficiency)):
        if value is not None and not 0 < value <= 1:
            raise ValueError(f"{field} must be in (0, 1], got {value!r}")
    if checkpoint_overhead_us_per_op is not None:
        if not checkpoint_overhead_us_per_op >= 0:
            raise ValueError(f"checkpoint_overhead_us_per_op must be at least 0, got {checkpoint_overhead_us_per_op!r}")
        spec = replace(spec, checkpoint_overhead_us_per_op=checkpoint_overhead_us_per_op,
                       checkpoint_overhead_source="given by the user")
    if peak_tflops is not None:
        spec = replace(spec, peak_tflops={k: peak_tflops for k in spec.peak_tflops})
    if mem_bandwidth_gbps is not None:
        spec = replace(spec, mem_bandwidth_gbps=mem_bandwidth_gbps)
    if compute_efficiency is not None:
        spec = replace(spec, compute_efficiency=compute_efficiency)
    if memory_efficiency is not None:
        spec = replace(spec, memory_efficiency=memory_efficiency)
    return spec


def cuda_device_entry(reported: str) -> str:
    """The table entry of a device as ``torch.cuda.get_device_name`` reports it (``NVIDIA H100 80GB HBM3``)."""
    key = reported.strip().lower()
    if key in DEVICES:
        return DEVICES[key].name
    for pattern, entry in _CUDA_NAMES:
        if re.search(pattern, key):
            return DEVICES[entry].name
    raise ValueError(f"the CUDA device {reported!r} is not in the device table; pass --target-device with one of "
                     f"{', '.join(device_names())} and --peak-tflops / --mem-bandwidth-gbps for its figures")


def _unknown_device(name: str) -> str:
    key = name.strip().lower()
    known = ", ".join(device_names())
    could_be = [s.name for k, s in DEVICES.items() if key and (k.startswith(key) or key in k)]
    if len(could_be) > 1:
        return f"target device {name!r} is ambiguous: it could be {' or '.join(could_be)}; give one exactly (known: {known})"
    if not could_be:
        could_be = [DEVICES[e].name for pattern, e in _CUDA_NAMES if re.search(pattern, key)][:1]
    if not could_be:
        could_be = [DEVICES[k].name for k in difflib.get_close_matches(key, list(DEVICES), n=3, cutoff=0.6)]
    if could_be:
        return f"target device {name!r} is not in the table; closest: {', '.join(could_be)} (known: {known})"
    return f"target device {name!r} is not in the table; known: {known}"

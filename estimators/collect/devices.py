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

Host link (``host_link_d2h_gbps`` / ``host_link_h2d_gbps``, GB/s = 10**9
bytes per second per direction): what offloading activations to host memory
copies over, device to host in the forward, host to device in the backward.
The figures are *effective* ones: about what pinned, large, copy-engine
copies (``tensor.to(..., non_blocking=True)`` from pinned memory) measure,
rounded down, not the link's encoded rate. The link is full duplex and
offloading uses one direction at a time, so the per-direction figure is the
one that counts. Measured copies reach about 80% of the encoded rate; the
table takes slightly less than the measurements, since a training step copies
many 10-100 MiB tensors, not one 1 GiB buffer.

* PCIe Gen4 x16 (A100-40GB, A100-80GB, L40S): 31.5 GB/s encoded per direction
  (128b/130b; https://hpc-notes.pages.dev/reference/pcie); measured H2D
  25.13 GB/s on an A100-SXM4-40GB at 512 MiB-1 GiB buffers, falling to
  16.5-18 GB/s at 10-20 GiB (https://github.com/NVIDIA/nvbandwidth/issues/42),
  and "25 GBps" as the measured peak of Gen4 x16 on an A100
  (https://github.com/ZaidQureshi/bam/issues/54); 25-26 GB/s each way on an
  A100 (https://github.com/NVIDIA/nvbandwidth/issues/11). Use 24 / 24. The L40S is
  taken from the same link, not measured.
* PCIe Gen5 x16 (H100-SXM, H100-PCIe, H200): 63.0 GB/s encoded per direction
  (PCI-SIG: 32 GT/s, "up to 128 GB/s via x16" both directions together);
  nvbandwidth on an 8x H100 node: SM copies D2H 52.8, H2D 35.2 GB/s per GPU
  (https://github.com/NVIDIA/nvbandwidth/issues/24); host to device 56.7-57.1
  GB/s on three of four GPUs of an H100 VM (the fourth 14.2: a board effect,
  https://github.com/NVIDIA/nvbandwidth/issues/6). Use 50 / 50. H200-SXM's
  host link is PCIe Gen5 x16 per its MLPerf inference v4.1 system description
  (H200-SXM-141GBx8). MI300X: PCIe Gen5 x16 too, 50 / 50 by the same rule,
  not measured (an assumption).
* NVLink-C2C (GH200): 450 GB/s per direction, 900 total (DataCrunch, "Data
  Movement in NVIDIA's Superchip Era",
  https://datacrunch.io/blog/data-movement-in-the-nvidia-gh200-grace-hopper-superchip;
  JSC's JUPITER configuration page). nvbandwidth on a GH200 480GB: H2D 346
  GB/s (copy engine) and H2D about 15% faster than D2H
  (https://github.com/NVIDIA/nvbandwidth/issues/23). Use 290 D2H / 340 H2D.
* cpu: none. A CPU target has no host link; plan with ``host_link_gbps``.

What the table cannot know: the board. Eight GPUs offloading at once share
the host's root complexes and DRAM, and where two GPUs sit behind one PCIe
switch each gets about half while both copy; NICs doing GPUDirect RDMA through
the same switch take their share (nvbandwidth#11 above: 5-6 GB/s per A100
when all copy both ways at once). The figures are for one GPU copying alone.
None of them is validated by this project on a GPU yet; override them with
``sacplan collect --host-link-gbps`` or the plan option ``host_link_gbps``.

GH200 (96 GB HBM3 at 4,000 GB/s, the 480 GB LPDDR5X version; DataCrunch and
JSC as above): the GPU is the H100 SXM5's GH100, so its tensor-core and FP32
figures are H100-SXM's. That is an assumption: the GH200 datasheet's own
figures were not found (its power limit is higher, so it may run faster).
The 144 GB HBM3e version is a different part and is not in the table.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, replace

from planner.stats.metadata import MIN_HOST_LINK_GBPS

__all__ = ["DeviceSpec", "DEVICES", "device_spec", "device_names", "cuda_device_entry", "CPU_CHECKPOINT_OVERHEAD_US"]

# The effective host-link figures (d2h, h2d GB/s) and their sources in one line each; the module docstring says why.
_PCIE4 = (24.0, 24.0, "PCIe Gen4 x16, effective (about 80% of 31.5 GB/s encoded; 25 GB/s measured on A100: "
          "NVIDIA/nvbandwidth#42 and #11, ZaidQureshi/bam#54), rounded down")
_PCIE5 = (50.0, 50.0, "PCIe Gen5 x16, effective (about 80% of 63 GB/s encoded; 52.8-57 GB/s measured on H100 "
          "boards: NVIDIA/nvbandwidth#24 and #6), rounded down")
_PCIE5_ASSUMED = (50.0, 50.0, "PCIe Gen5 x16, assumed as for H100 (not measured on this part)")
_C2C = (290.0, 340.0, "NVLink-C2C, effective (450 GB/s per direction; H2D 346 GB/s measured, D2H about 15% less: "
        "NVIDIA/nvbandwidth#23)")


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
    host_link_d2h_gbps: float | None = None  # effective GB/s device to host (see the module docstring); None: no link
    host_link_h2d_gbps: float | None = None  # effective GB/s host to device
    host_link_source: str | None = None

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
          host_link: tuple[float, float, str] | None, kind: str = "cuda") -> DeviceSpec:
    d2h, h2d, link_source = host_link if host_link is not None else (None, None, None)
    return DeviceSpec(name, kind, {"bf16": bf16, "fp16": bf16, "tf32": tf32, "fp32": fp32, "fp64": fp32 / 2},
                      gbps, source, checkpoint_overhead_source=_MEASURED if kind == "cpu" else _HOST_ESTIMATE,
                      memory_gb=memory_gb, host_link_d2h_gbps=d2h, host_link_h2d_gbps=h2d,
                      host_link_source=link_source)


_NV_A100 = "NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), SXM, dense"
_NV_H100 = "NVIDIA H100 Tensor Core GPU datasheet, dense (half the with-sparsity figures)"
DEVICES: dict[str, DeviceSpec] = {
    s.name.lower(): s
    for s in (
        _spec("A100-40GB", 312.0, 156.0, 19.5, 1555.0, 40, _NV_A100, _PCIE4),
        _spec("A100-80GB", 312.0, 156.0, 19.5, 2039.0, 80, _NV_A100, _PCIE4),
        _spec("H100-SXM", 989.5, 494.5, 67.0, 3350.0, 80, _NV_H100 + ", SXM5", _PCIE5),
        _spec("H100-PCIe", 756.5, 378.0, 51.0, 2000.0, 80, _NV_H100 + ", PCIe", _PCIE5),
        _spec("H200", 989.5, 494.5, 67.0, 4800.0, 141, "NVIDIA H200 Tensor Core GPU datasheet, SXM, dense", _PCIE5),
        _spec("GH200", 989.5, 494.5, 67.0, 4000.0, 96, "96 GB HBM3 at 4 TB/s (DataCrunch's GH200 memcpy analysis, "
              "JSC JUPITER configuration); compute assumed H100-SXM's (same GH100), datasheet not found", _C2C),
        _spec("L40S", 366.5, 183.0, 91.6, 864.0, 48, "NVIDIA L40S datasheet, dense (half the with-sparsity figures)",
              _PCIE4),
        _spec("MI300X", 1307.4, 653.7, 163.4, 5300.0, 192, "AMD Instinct MI300X data sheet, dense matrix",
              _PCIE5_ASSUMED),
        _spec("cpu", 1.0, 1.0, 1.0, 50.0, None, "placeholder, not a datasheet figure: override it", None, kind="cpu"),
    )
}

# Names as torch.cuda.get_device_name reports them -> table entries; each pattern names one part
# (an H100 NVL, say, matches none and is refused rather than costed as another H100).
_CUDA_NAMES = (
    (r"a100.*80", "a100-80gb"),
    (r"a100.*40", "a100-40gb"),
    (r"h100.*pcie", "h100-pcie"),
    (r"h100.*(sxm|hbm3)", "h100-sxm"),
    (r"(?<!g)h200", "h200"),  # not GH200
    (r"gh200.*480", "gh200"),  # "NVIDIA GH200 480GB": 96 GB HBM3; the 144 GB HBM3e part matches none
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
    host_link_gbps: float | None = None,
) -> DeviceSpec:
    """The table entry for ``name`` (case-insensitive), with user overrides.

    ``peak_tflops`` replaces the peak of every dtype; ``host_link_gbps`` both
    directions of the host link (a ``cpu`` target gets one this way). A name that is not an
    entry is refused (``ValueError`` naming the entries it could mean), never
    guessed; see :func:`cuda_device_entry` for the names CUDA reports.
    """
    spec = DEVICES.get(name.strip().lower())
    if spec is None:
        raise ValueError(_unknown_device(name))
    if host_link_gbps is not None and not MIN_HOST_LINK_GBPS <= host_link_gbps < float("inf"):
        raise ValueError(f"host_link_gbps must be a positive number of GB/s (at least {MIN_HOST_LINK_GBPS:g}), "
                         f"got {host_link_gbps!r}")
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
    if host_link_gbps is not None:
        spec = replace(spec, host_link_d2h_gbps=host_link_gbps, host_link_h2d_gbps=host_link_gbps,
                       host_link_source="given by the user (--host-link-gbps)")
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

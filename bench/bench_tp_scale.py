"""Tensor parallel at scale, on paper: one rank of Llama-3-70B at TP 8 x FSDP 64 (512 ranks), for an H100.

One collection in this process: ``sacplan collect``'s library call with
``--tp-size 8 --fsdp-world-size 64 --mixed-precision bf16`` (the model's HF
TP plan, then fully_shard over its decoder layers), batch 1, seq 8192, AdamW,
costs and attention kernels of an H100-SXM, the model built on meta and run
on fake tensors under PyTorch's fake process group. Prints the collection's
CPU and wall time, the process's peak RSS, the per-rank baseline and the
plan at the H100's 74.5 GiB.

    python bench/bench_tp_scale.py [--model 70b] [--tp 8] [--fsdp 64] [--sequence-parallel]

``--sequence-parallel``: the HF plan with sequence parallel derived from it
(``sacplan collect --sequence-parallel``, docs/tensor-parallel.md): the
residual stream, norms and the layers' held inputs on seq / TP tokens.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_fsdp_scale import MODELS, TARGET  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="70b", choices=sorted(MODELS))
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--fsdp", type=int, default=64)
    ap.add_argument("--sequence-parallel", action="store_true")
    args = ap.parse_args()
    from estimators import CollectRequest, device_spec, run_collection
    from planner import GIB, min_feasible_budget_gib, plan

    req = CollectRequest(hf_config=dict(MODELS[args.model]), batch=1, seq=8192, dtype="fp32", optimizer="adamw",
                         target_device=TARGET, fsdp_world_size=args.fsdp, mixed_precision="bf16", tp_size=args.tp,
                         sequence_parallel=args.sequence_parallel, name=f"llama-3-{args.model}")
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result = run_collection(req)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    stats = result.stats
    device_gib = device_spec(TARGET).memory_bytes / GIB
    sp = " with sequence parallel" if args.sequence_parallel else ""
    line = (f"llama-3-{args.model} TP {args.tp}{sp} x FSDP {args.fsdp}: collected in {wall:.1f} s wall ({cpu:.1f} s CPU), "
            f"per-rank parameters {stats.root.param_bytes / GIB:.2f} GiB, baseline {result.baseline_peak_bytes / GIB:.1f} "
            f"GiB, smallest budget {min_feasible_budget_gib(stats):.1f} GiB")
    if result.baseline_peak_bytes / GIB > device_gib:
        p = plan(stats, device_gib, time_limit_s=60)
        line += (f"; plan at {device_gib:.1f} GiB: {p.status}, {len(p.modules)} modules, peak "
                 f"{(p.peak_bytes or 0) / GIB:.1f} GiB, recompute {p.recompute_ms or 0:.0f} ms")
    line += f"; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB"
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

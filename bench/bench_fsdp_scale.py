"""FSDP2 at scale, on paper: one rank of Llama-3-8B and -70B shapes at 8, 64 and 512 ranks, planned for an H100.

Each collection runs in a fresh subprocess (its peak RSS is its own):
``sacplan collect``'s library call with ``--fsdp-world-size N
--mixed-precision bf16`` (fp32 sharded parameters, bf16 gathered compute
parameters, fp32 gradient reduction), batch 1, seq 8192, AdamW, costs and
attention kernels of an H100-SXM, the model built on meta and run on fake
tensors under PyTorch's fake process group. Per cell: collection time (process
CPU seconds of the collection call, and wall seconds of the whole child,
imports included), the child's peak RSS, the per-rank baseline peak (no
checkpointing, steady state), the smallest budget with a plan, and the plan
for the H100's 80 GB (74.5 GiB) if the baseline does not fit.

    python bench/bench_fsdp_scale.py [--models 8b,70b] [--ranks 8,64,512] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._machine import cpu_model  # noqa: E402
from bench.bench_planner import write_results  # noqa: E402

SECTION = "## FSDP2 at scale"
_COMMON = {"model_type": "llama", "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0,
           "rms_norm_eps": 1e-5, "bos_token_id": 128000, "eos_token_id": 128001}
MODELS = {
    "8b": {**_COMMON, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8},
    "70b": {**_COMMON, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
            "num_attention_heads": 64, "num_key_value_heads": 8},
    "405b": {**_COMMON, "hidden_size": 16384, "intermediate_size": 53248, "num_hidden_layers": 126,
             "num_attention_heads": 128, "num_key_value_heads": 8},
}
TARGET = "H100-SXM"


def _child(model: str, ranks: int) -> dict:
    t_wall = time.perf_counter()
    from estimators import CollectRequest, device_spec, run_collection
    from planner import GIB, min_feasible_budget_gib, plan

    req = CollectRequest(hf_config=dict(MODELS[model]), batch=1, seq=8192, dtype="fp32", optimizer="adamw",
                         target_device=TARGET, fsdp_world_size=ranks, mixed_precision="bf16",
                         name=f"llama-3-{model}")
    cpu0 = time.process_time()
    result = run_collection(req)
    cpu = time.process_time() - cpu0
    stats = result.stats
    device_gib = device_spec(TARGET).memory_bytes / GIB
    out = {"model": model, "ranks": ranks, "collect_cpu_s": cpu, "collect_wall_s": result.seconds,
           "params": result.parameter_count, "param_bytes": stats.root.param_bytes,
           "baseline_gib": result.baseline_peak_bytes / GIB, "min_budget_gib": min_feasible_budget_gib(stats)}
    if out["baseline_gib"] > device_gib and out["min_budget_gib"] <= device_gib:
        p = plan(stats, device_gib, time_limit_s=60)
        out.update(plan_status=p.status, plan_modules=len(p.modules), plan_peak_gib=p.peak_bytes / GIB,
                   recompute_ms=p.recompute_ms, compute_ms=p.compute_ms)
    out["child_wall_s"] = time.perf_counter() - t_wall
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _spawn(model: str, ranks: int) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", model, str(ranks)], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        return {"model": model, "ranks": ranks, "error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _machine() -> str:
    import torch

    return (f"{cpu_model()}, {os.cpu_count()} cores (shared with other work), Python {platform.python_version()}, "
            f"torch {torch.__version__} (CPU)")


def _row(r: dict) -> str:
    if "error" in r:
        return f"| {r['model']} | {r['ranks']} | error: {r['error'][:200]} | | | | | | |"
    if "plan_status" in r:
        share = f"{r['recompute_ms'] / r['compute_ms']:.1%}" if r["compute_ms"] else "-"
        n = r["plan_modules"]
        planned = (f"{r['plan_status']}, {n} module{'s' if n != 1 else ''}, peak {r['plan_peak_gib']:.1f} GiB, "
                   f"recompute {r['recompute_ms']:.0f} ms ({share} of the step)")
    elif r["baseline_gib"] <= 74.5:
        planned = "fits without checkpointing"
    else:
        planned = "no plan fits"
    return (f"| {r['model']} | {r['ranks']} | {r['collect_cpu_s']:.1f} | {r['child_wall_s']:.1f} | "
            f"{r['peak_rss_mib']:.0f} | {r['param_bytes'] / 2**30:.2f} | {r['baseline_gib']:.1f} | "
            f"{r['min_budget_gib']:.1f} | {planned} |")


def _report(rows: list[dict], command: str) -> str:
    lines = [
        SECTION, "",
        f"Machine: {_machine()}. Command: `{command}`.", "",
        "One rank of an FSDP2 job (`sacplan collect --hf-config ... --batch 1 --seq 8192 --fsdp-world-size N "
        "--mixed-precision bf16 --target-device H100-SXM`; units: the decoder layers and the root), AdamW, "
        "steady state. CPU s: process CPU time of the collection call; wall s: the whole subprocess, imports and "
        "planning included; RSS: the subprocess's peak. Params: this rank's fp32 shard. Baseline: the per-rank "
        "peak without checkpointing; min budget: the smallest with a plan; plan: at the H100's 80 GB = 74.5 GiB.",
        "",
        "| model | ranks | collect CPU s | wall s | peak RSS MiB | params GiB | baseline GiB | min budget GiB | "
        "plan at 74.5 GiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    lines += [_row(r) for r in rows] + ["", _verdict(rows), "",
              "Where the time grows with the ranks: `fully_shard` splits every parameter into N fake chunks "
              "(`torch.chunk` in FSDP2's sharding, twice per parameter), about two thirds of a 512-rank collection "
              "in a profile of a 4-layer 8B shape; the fake step itself does not depend on N. Peak RSS is the "
              "Python process with torch and transformers imported, the fake tensors hold no data."]
    return "\n".join(lines) + "\n"


def _verdict(rows: list[dict]) -> str:
    """The issue's target for the 70B shape at 512 ranks: under a minute and under 2 GB of host memory."""
    r = next((r for r in rows if r.get("model") == "70b" and r.get("ranks") == 512 and "error" not in r), None)
    if r is None:
        return "Target (70B at 512 ranks under a minute and 2 GB): not measured in this run."
    cpu_ok, rss_ok = r["collect_cpu_s"] < 60, r["peak_rss_mib"] * 2**20 < 2 * 10**9
    return (f"Target (issue 20: a Llama-3-70B shape at 512 ranks in under a minute and under 2 GB): "
            f"{r['collect_cpu_s']:.1f} s of CPU time ({'met' if cpu_ok else 'not met'}) and "
            f"{r['peak_rss_mib']:.0f} MiB peak RSS ({'met' if rss_ok else 'not met'}). Wall time on this shared "
            f"machine ({os.cpu_count()} cores, other work running) was {r['collect_wall_s']:.0f} s for the "
            f"collection: the difference is waiting for a core, so the CPU time is the measure here, and it is "
            f"close to the limit (it varies by several seconds between runs under this load).")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="8b,70b")
    ap.add_argument("--ranks", default="8,64,512")
    ap.add_argument("--write", action="store_true", help=f"write the table to bench/RESULTS.md ({SECTION})")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.child[0], int(args.child[1]))))
        return 0
    rows = []
    for model in args.models.split(","):
        for ranks in (int(x) for x in args.ranks.split(",")):
            rows.append(_spawn(model, ranks))
            print(json.dumps(rows[-1]), flush=True)
    text = _report(rows, " ".join(["python", "bench/bench_fsdp_scale.py"] + sys.argv[1:]))
    print(text)
    if args.write:
        write_results(text, ROOT / "bench" / "RESULTS.md", SECTION)
    return 0


if __name__ == "__main__":
    sys.exit(main())

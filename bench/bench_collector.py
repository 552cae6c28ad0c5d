"""Collector benchmark: sacplan's one-pass collector vs PyTorch's three-pass pipeline.

Same model (the torch-test ``Transformer``: dim 768, 12 heads, vocab 8192,
seq 1024, dropout 0.1, batch 8, fp32, Adam; PyTorch's SAC test family), same
machine, one script, each run in a fresh subprocess so its peak RSS is its own.

PyTorch's pipeline: MemTracker (two steps, to build the optimizer state),
RuntimeEstimator and SACEstimator (one forward+backward each, operator-level
roofline), then ``ilp_utils.aggregate_stats``. On a CPU-only machine the
roofline refuses to run ("needs to access CUDA capabilities"): we answer its
three probes for an A100-SXM (the figures of the reference data) by patching,
for the duration of the PyTorch run only, ``torch.cuda.is_available`` -> True
and ``torch.utils._runtime_estimation.get_device_tflops`` /
``get_gpu_dram_gbps`` -> 312 TFLOP/s (bf16/fp16), 156 (tf32), 19.5 (fp32) and
2039 GB/s. Nothing else in PyTorch's code path touches CUDA here.

Ours: ``estimators.collect_stats`` with the A100-80GB table entry, CPU fake
tensors, CUDA kernel emulation on (what ``sacplan collect --target-device
A100-80GB`` does).

Also: a Llama-3-8B-shaped HF config (32 layers, 4096 wide, seq 8192, batch 1,
bf16, built on meta, collected under fake tensors for an H100-SXM).

Usage: python bench/bench_collector.py [--layers 4,16,32] [--skip-torch] [--write]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LLAMA3_8B = {
    "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
}


def _transformer(layers: int):
    import torch
    from torch.testing._internal.distributed._tensor.common_dtensor import ModelArgs, Transformer

    args = ModelArgs(n_layers=layers, n_heads=12, vocab_size=8192, max_seq_len=1024, dim=768, dropout_p=0.1)
    with torch.device("meta"):
        model = Transformer(args)
    return model, torch.randint(0, 8192, (8, 1024), device="meta")


def run_ours(layers: int) -> dict:
    from estimators import RooflineCostModel, collect_stats, device_spec
    from planner import baseline_peak_bytes

    model, tokens = _transformer(layers)
    t0 = time.perf_counter()
    stats = collect_stats(model, (tokens,), optimizer="adam", device="cpu",
                          cost_model=RooflineCostModel(device_spec("A100-80GB")),
                          emulate_cuda_attention=True, round_bytes_to=512)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "modules": len(stats.modules), "baseline_peak_bytes": baseline_peak_bytes(stats)}


def run_torch(layers: int) -> dict:
    from unittest import mock

    import torch
    import torch.utils._runtime_estimation as rt
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.ilp_utils import aggregate_stats
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed._tools.runtime_estimator import RuntimeEstimator
    from torch.distributed._tools.sac_estimator import SACEstimator

    a100_tflops = {torch.float16: 312.0, torch.bfloat16: 312.0, torch.float32: 19.5}

    def tflops(dtype):
        if dtype is torch.float32 and torch.backends.cuda.matmul.fp32_precision == "tf32":
            return 156.0
        return a100_tflops.get(dtype, 312.0)

    probes = (
        mock.patch.object(torch.cuda, "is_available", lambda: True),
        mock.patch.object(rt, "get_device_tflops", tflops),
        mock.patch.object(rt, "get_gpu_dram_gbps", lambda: 2039),
    )
    t0 = time.perf_counter()
    with FakeTensorMode():
        from torch.testing._internal.distributed._tensor.common_dtensor import ModelArgs, Transformer

        model = Transformer(ModelArgs(n_layers=layers, n_heads=12, vocab_size=8192, max_seq_len=1024, dim=768,
                                      dropout_p=0.1))
        optim = torch.optim.Adam(model.parameters(), foreach=False)
        inp = torch.randint(0, 8192, (8, 1024))
        mem = MemTracker()
        mem.track_external(model, optim)
        with mem:
            for step in range(2):  # the second step sees the optimizer state
                model(inp).sum().backward()
                optim.step()
                optim.zero_grad()
                if step == 0:
                    mem.reset_mod_stats()
        with probes[0], probes[1], probes[2]:
            runtime = RuntimeEstimator()
            with runtime(estimate_mode_type="operator-level-cost-model"):
                model(inp).sum().backward()
            sac = SACEstimator()
            with sac(estimate_mode_type="operator-level-cost-model"):
                model(inp).sum().backward()
        info = aggregate_stats(model, mem, runtime, sac, torch.device("cpu"))
    return {"seconds": time.perf_counter() - t0, "modules": len(info["mod_stats"])}


def run_llama8b() -> dict:
    import torch

    from estimators import RooflineCostModel, build_from_hf_config, collect_stats, device_spec
    from planner import baseline_peak_bytes

    t0 = time.perf_counter()
    built = build_from_hf_config(LLAMA3_8B, batch_size=1, seq_len=8192, dtype=torch.bfloat16,
                                 device=torch.device("meta"))
    build_s = time.perf_counter() - t0
    stats = collect_stats(built.model, built.inputs, optimizer="adamw", device="cpu", dtype=torch.bfloat16,
                          cost_model=RooflineCostModel(device_spec("H100-SXM")),
                          emulate_cuda_attention=True, round_bytes_to=512)
    return {"seconds": time.perf_counter() - t0, "build_seconds": build_s, "modules": len(stats.modules),
            "baseline_peak_bytes": baseline_peak_bytes(stats), "params": sum(p.numel() for p in built.model.parameters())}


def _child(kind: str, layers: int) -> dict:
    out = {"ours": run_ours, "torch": run_torch}[kind](layers) if kind != "llama8b" else run_llama8b()
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _spawn(kind: str, layers: int) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", kind, str(layers)], capture_output=True, text=True,
                          cwd=ROOT, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _machine() -> str:
    import os

    import torch

    cpu = cpu_model()
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__} (CPU)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="4,16,32")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--skip-llama", action="store_true")
    ap.add_argument("--write", action="store_true", help="write the figures to bench/RESULTS.md (## Collector)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.child[0], int(args.child[1]))))
        return 0
    if not args.skip_torch and not _has_pwlf():
        # PyTorch's SACEstimator fits its trade-off curves with pwlf: without it every PyTorch run fails
        ap.error("PyTorch's pipeline needs pwlf (SACEstimator fits its curves with it): pip install pwlf (the "
                 "'bench' extra), or pass --skip-torch")
    rows, failed = [], []
    for layers in [int(x) for x in args.layers.split(",")]:
        ours = _spawn("ours", layers)
        theirs = {} if args.skip_torch else _spawn("torch", layers)
        rows.append((layers, ours, theirs))
        failed += [f"{who} L={layers}: {r['error']}" for who, r in (("ours", ours), ("PyTorch", theirs))
                   if "error" in r]
        print(f"L={layers:>3}  ours {ours}  pytorch {theirs or 'skipped'}", flush=True)
    llama = None if args.skip_llama else _spawn("llama8b", 0)
    if llama:
        print(f"llama-3-8b shape: {llama}", flush=True)
        failed += [f"llama-3-8b shape: {llama['error']}"] if "error" in llama else []
    if failed:  # an error is no figure: nothing is written
        print("failed, nothing written:\n" + "\n".join(failed), file=sys.stderr)
        return 1
    text = _report(rows, llama, " ".join(["python", "bench/bench_collector.py"] + sys.argv[1:]))
    print(text)
    if args.write:
        _write(text)
    return 0


def _has_pwlf() -> bool:
    try:
        import pwlf  # noqa: F401
    except ImportError:
        return False
    return True


def _fmt(r: dict, key: str, f: str) -> str:
    return format(r[key], f) if key in r else "skipped"


def _report(rows, llama, command: str) -> str:
    lines = [
        "## Collector",
        "",
        f"Machine: {_machine()}. Command: `{command}`.",
        "",
        "torch-test Transformer (dim 768, 12 heads, vocab 8192, seq 1024, batch 8, fp32, Adam, dropout 0.1), "
        "fake tensors on CPU. PyTorch = MemTracker + RuntimeEstimator + SACEstimator + aggregate_stats, its CUDA "
        "probes answered with A100-SXM figures (see the script's docstring); ours = one pass, A100-80GB target "
        "with CUDA kernel emulation. Peak RSS is the whole subprocess (Python + torch import included).",
        "",
        "| layers | ours s | ours peak RSS MiB | PyTorch s | PyTorch peak RSS MiB | PyTorch / ours |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for layers, ours, theirs in rows:
        ratio = f"{theirs['seconds'] / ours['seconds']:.1f}x" if "seconds" in theirs else "-"
        lines.append(f"| {layers} | {_fmt(ours, 'seconds', '.2f')} | {_fmt(ours, 'peak_rss_mib', '.0f')} | "
                     f"{_fmt(theirs, 'seconds', '.2f')} | {_fmt(theirs, 'peak_rss_mib', '.0f')} | {ratio} |")
    if llama:
        lines += [
            "",
            "Llama-3-8B-shaped HF config (32 layers, hidden 4096, 32/8 heads, vocab 128256, seq 8192, batch 1, bf16, "
            "AdamW), built on meta, collected under fake tensors for an H100-SXM:",
            "",
            f"- time {_fmt(llama, 'seconds', '.1f')} s (model build on meta {_fmt(llama, 'build_seconds', '.1f')} s), "
            f"peak RSS {_fmt(llama, 'peak_rss_mib', '.0f')} MiB, {llama.get('modules', 'n/a')} modules, "
            f"{llama.get('params', 0):,} parameters, baseline peak "
            f"{llama.get('baseline_peak_bytes', 0) / 2**30:.1f} GiB.",
        ]
    return "\n".join(lines) + "\n"


def _write(text: str) -> None:
    path = ROOT / "bench" / "RESULTS.md"
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    start = old.find("## Collector")
    if start >= 0:
        end = old.find("\n## ", start + 1)
        old = old[:start] + old[end + 1:] if end >= 0 else old[:start]
    path.write_text(old.rstrip() + "\n\n" + text)


if __name__ == "__main__":
    sys.exit(main())

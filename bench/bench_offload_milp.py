"""Offloading (issue 31), the MILP engine: plans with offload off and on, side by side, on small inputs.

    python bench/bench_offload_milp.py [--stats-dir DIR]   # ~3-4 min on 2 shared cores; prints a markdown table

Inputs (every one with a timeline: offloading's windows follow the step's moments):

* ``service/example_stats.json``: the service's two-layer example (tiny);
* a Llama-3-8B-shaped model cut to 4 and to 8 layers (the layers of ``tests/planner/test_collected_stack.py``,
  seq 8192, bf16, AdamW, H100-SXM costs), collected here by ``sacplan collect`` from a config (random
  weights on meta, nothing downloaded); kept in ``--stats-dir`` between runs.

Each input gets 5 budgets evenly spaced from its smallest feasible budget (offload off) to its no-checkpointing
peak. Each budget is planned with offload off and then on (``host_link_gbps=24``: PCIe Gen4 x16's effective
figure, /work/notes/offload-planner section 3), one ``planner.plan`` call each on the parsed stats, 60 s limit.
Printed per budget: status, recompute ms (off), recompute + stall = step overhead (on), host GiB, seconds.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import planner  # noqa: E402
from bench._machine import describe_machine  # noqa: E402

LAYER_8B = ('{"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, '
            '"num_hidden_layers": %d, "num_attention_heads": 32, "num_key_value_heads": 8, '
            '"max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-5}')
GBPS = 24.0


def collected(layers: int, folder: Path) -> Path:
    """The Llama-3-8B-layer model with ``layers`` layers, collected once into ``folder``."""
    out = folder / f"llama-3-8b-{layers}-layers.json"
    if not out.exists():
        config = folder / f"llama-{layers}.json"
        config.write_text(LAYER_8B % layers)
        subprocess.run([sys.executable, "-m", "planner.cli", "collect", "--hf-config", str(config), "--batch", "1",
                        "--seq", "8192", "--dtype", "bf16", "--optimizer", "adamw", "--target-device", "H100-SXM",
                        "--name", f"llama-3-8b-{layers}-layers", "--out", str(out), "--quiet"], check=True,
                       cwd=REPO, stdout=subprocess.DEVNULL)
    return out


def rows(name: str, stats: planner.Stats) -> list[str]:
    low = planner.min_feasible_budget_gib(stats)
    base = planner.plan(stats, 1e6).baseline_peak_bytes / planner.GIB
    out = []
    for k in range(5):
        budget = round(low + (base - low) * k / 5, 3)
        t = time.perf_counter()
        off = planner.plan(stats, budget, time_limit_s=60)
        off_s = time.perf_counter() - t
        t = time.perf_counter()
        on = planner.plan(stats, budget, offload="on", host_link_gbps=GBPS, time_limit_s=60)
        on_s = time.perf_counter() - t
        host = "-" if on.host_bytes is None else f"{on.host_bytes / planner.GIB:.3f}"
        stall = "-" if on.offload_stall_ms is None else f"{on.offload_stall_ms:.2f}"
        over = "-" if on.step_overhead_ms is None else f"{on.step_overhead_ms:.2f}"
        rc_off = "-" if off.recompute_ms is None else f"{off.recompute_ms:.2f}"
        rc_on = "-" if on.recompute_ms is None else f"{on.recompute_ms:.2f}"
        out.append(f"| {name} | {budget:g} | {off.status} | {rc_off} | {off_s:.2f} | {on.status} | {rc_on} | {stall} "
                   f"| {over} | {host} | {on_s:.2f} |")
        print(out[-1], flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stats-dir", type=Path, default=None, help="where the collected stats are kept")
    args = ap.parse_args()
    folder = args.stats_dir or Path(tempfile.mkdtemp(prefix="offload-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(describe_machine("python bench/bench_offload_milp.py"))
    print("| input | budget GiB | off | recompute ms | s | on | recompute ms | stall ms | overhead ms | host GiB | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows("service example (2 layers)", planner.load_stats(REPO / "service" / "example_stats.json"))
    for layers in (4, 8):
        rows(f"Llama-3-8B layers x{layers}", planner.load_stats(collected(layers, folder)))


if __name__ == "__main__":
    main()

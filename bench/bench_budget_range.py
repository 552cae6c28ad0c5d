"""Every budget of deep models: the planner from the smallest feasible budget to no checkpointing.

    python bench/bench_budget_range.py            # ~5 min on 2 cores; rewrites its section of bench/RESULTS.md
    python bench/bench_budget_range.py --quick    # 11 budgets per input, no certification; prints only
    python bench/bench_budget_range.py --collected [--stats-dir DIR]
        # collected Llama-3 8B/70B/405B stats (bench/collected_llama.py), 41 budgets each, a 41-point sweep;
        # rewrites its own section of bench/RESULTS.md (their independent checks: bench/bench_collected_checks.py)

bench_planner.py compares with PyTorch at a few budgets per input. This one
asks whether every budget a user might pick is planned fast and proven
optimal, on deep stacks where that is hardest:

* synthetic stacks of 32, 96 and 200 copies of block 5 of the L12 sample
  (bench/synthetic.py), and
* a Llama-shaped Hugging Face model with 48 layers (hidden 2048, 16/4 heads,
  seq 4096, bf16, AdamW, H100-SXM costs) collected here by ``sacplan
  collect`` from a config (random weights on meta, nothing downloaded): the
  path a user takes, a model-spanning decoder module included.

Each input gets 41 budgets evenly spaced from its smallest feasible budget to
its no-checkpointing peak; each budget is one ``planner.plan`` call on the
parsed stats, as a user makes it (nothing shared between calls).

Two checks that do not trust the planner's own proof, on the 96-block stack
at five budgets (the two tightest of the range and bench_planner.py's three): HiGHS (scipy.optimize.milp) on a count-space relaxation
formulated here from scratch (the blocks before the last one as integer counts
over their joint frontier, their memory constraints dropped; every
constraint from the last block on kept), whose dual bound no plan can beat;
and the exact DP with the stack relaxation switched off and 30 times its work
allowance. On the Llama model our own MILP engine (``solver="milp"``, 60 s
limit), the path those plans took before the planner learned to handle
model-spanning modules, runs at three budgets for reference.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import planner  # noqa: E402
import planner.solve.dp as dp  # noqa: E402
from bench.bench_planner import machine, write_results  # noqa: E402
from bench.count_space import count_space_bound  # noqa: E402
from bench.synthetic import make_layers  # noqa: E402
from planner.solve.problem import prepare  # noqa: E402

GIB = 2**30
SOURCE = Path("../shared/reference/torch_format_transformer_L12.json")
SECTION = "## Planner: every budget of deep models"
COLLECTED_SECTION = "## Planner: every budget of collected Llama-3 stats"
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
         "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 4, "num_hidden_layers": 48,
         "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "hidden_act": "silu",
         "tie_word_embeddings": False}


def collect_llama(log) -> tuple[planner.Stats, float]:
    """The 48-layer Llama's stats, collected by the CLI as a user would; (stats, seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg, out = Path(tmp) / "llama48.json", Path(tmp) / "stats.json"
        cfg.write_text(json.dumps(LLAMA))
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "planner.cli", "collect", "--hf-config", str(cfg), "--batch", "2",
                        "--seq", "4096", "--dtype", "bf16", "--optimizer", "adamw", "--target-device", "H100-SXM",
                        "--out", str(out), "--quiet"], check=True, cwd=REPO)
        seconds = time.perf_counter() - t0
        log(f"collected the 48-layer Llama in {seconds:.1f} s")
        return planner.load_stats(out), seconds


def budget_range(stats: planner.Stats, n: int, **options) -> tuple[list[float], float, float]:
    low = planner.plan(stats, 1e-6, **options).min_feasible_budget_gib
    base = planner.plan(stats, 1e6, **options).baseline_peak_bytes / GIB
    return [low + (base - low) * i / (n - 1) for i in range(n)], low, base


def run_range(label: str, stats: planner.Stats, n: int, log) -> dict:
    budgets, low, base = budget_range(stats, n)
    rows = []
    for b in budgets:
        t0 = time.perf_counter()
        p = planner.plan(stats, b)
        rows.append((b, p, time.perf_counter() - t0))
        log(f"  {label} {b:9.3f} GiB  {p.status:10s} gap {p.mip_gap or 0:.1e}  {rows[-1][2]:.3f} s")
    times = sorted(r[2] for r in rows)
    statuses = [r[1].status for r in rows]
    unproven = [r for r in rows if r[1].status not in ("optimal", "infeasible")]
    over = [r for r in rows if r[1].peak_bytes is not None and r[1].peak_bytes > r[0] * GIB]
    return {"label": label, "modules": len(stats.modules), "low": low, "base": base, "n": len(rows),
            "optimal": statuses.count("optimal"), "unproven": unproven, "over": over,
            "median": statistics.median(times), "p90": times[int(0.9 * (len(times) - 1))], "max": times[-1],
            "slowest": max(rows, key=lambda r: r[2])}


def count_bound(stats: planner.Stats, budget_gib: float, time_limit: float = 120.0) -> tuple[float, float]:
    """HiGHS's dual bound on a count-space relaxation (bench/count_space.py, the last block exact); (bound ms,
    seconds).

    Kept: every memory constraint from the last block's start on, that block
    modelled exactly (one binary per frontier point, at most one checkpoint
    per root-to-leaf path). Dropped: the constraints before it; the blocks
    before it then matter only through their total discard and recompute,
    and identical ones become one integer count per point of their joint
    frontier.
    """
    b = count_space_bound(stats, budget_gib, tail_blocks=1, time_limit_s=time_limit, mip_rel_gap=1e-9)
    return b.bound_ms, b.seconds


def dp_without_stack(stats: planner.Stats, budget_gib: float) -> tuple[planner.Plan, float]:
    """The exact DP alone (no stack relaxation), 30x its work allowance; (its solution, seconds)."""
    saved = dp.STACK_FIRST_BLOCKS
    dp.STACK_FIRST_BLOCKS = 10**9
    try:
        prob = prepare(stats)
        t0 = time.perf_counter()
        sol = dp.solve_dp(prob, budget_gib * GIB, time_limit_s=600, work_limit=3e8, state_limit=5_000_000)
        return sol, time.perf_counter() - t0
    finally:
        dp.STACK_FIRST_BLOCKS = saved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="11 budgets per input, no certification, no write")
    ap.add_argument("--collected", action="store_true", help="the collected Llama-3 inputs instead")
    ap.add_argument("--stats-dir", type=Path, default=None, help="where collected stats are kept and reused "
                    "(default: a temporary folder)")
    ap.add_argument("--only", default="", help="with --collected: comma-separated input files to run (e.g. 405b-ws.json)")
    args = ap.parse_args(argv)
    log = lambda s: print(s, flush=True)  # noqa: E731
    if args.collected:
        from bench.bench_collected_range import run_collected_bench
        return run_collected_bench(args, log)
    started = time.time()
    head = machine()
    n = 11 if args.quick else 41
    src = json.loads((REPO / SOURCE).read_text())
    inputs = [(f"synthetic {k}L", planner.parse_stats(make_layers(src, k))) for k in (32, 96, 200)]
    llama, collect_s = collect_llama(log)
    inputs.append(("Llama 48L (collected)", llama))
    results = [run_range(label, stats, n, log) for label, stats in inputs]

    cert = []
    if not args.quick:
        stats96 = inputs[1][1]
        budgets, low, base = budget_range(stats96, 41)
        # the two tightest budgets of the range, and bench_planner.py's three for this stack
        lo, hi = math.ceil(low * 1000) / 1000, math.ceil(base * 1.02 * 1000) / 1000
        for b in (budgets[0], budgets[1], *(round(lo + (hi - lo) * x, 3) for x in (0.25, 0.5, 0.75))):
            p = planner.plan(stats96, b)
            bound, bound_s = count_bound(stats96, b)
            alone, alone_s = dp_without_stack(stats96, b)
            cert.append((b, p, bound, bound_s, alone, alone_s))
            log(f"  certify 96L {b:.3f} GiB: plan {p.recompute_ms:.6f} ({p.status}); HiGHS bound {bound:.6f} "
                f"({bound_s:.1f} s); DP alone {alone.recompute_ms:.6f} {alone.status} ({alone_s:.1f} s)")
    milp_ref = []
    if not args.quick:
        budgets, _, _ = budget_range(llama, 41)
        for i in (10, 20, 30):
            t0 = time.perf_counter()
            q = planner.plan(llama, budgets[i], solver="milp", time_limit_s=60)
            milp_ref.append((budgets[i], q, time.perf_counter() - t0))
            log(f"  Llama MILP {budgets[i]:.3f} GiB: {q.status} gap {q.mip_gap} {milp_ref[-1][2]:.1f} s")

    out = [SECTION, "", f"Machine: {head}", "",
           f"Command: `python bench/bench_budget_range.py{' --quick' if args.quick else ''}` "
           f"({(time.time() - started) / 60:.1f} min in all). {n} budgets per input, evenly spaced from the smallest "
           "feasible budget to the no-checkpointing peak; each is one `planner.plan` call on parsed stats (nothing "
           "shared between calls), wall-clock seconds. The Llama model (48 layers, hidden 2048, 16/4 heads, seq 4096, "
           f"batch 2, bf16, AdamW, H100-SXM costs) was collected by `sacplan collect --hf-config` in {collect_s:.0f} s "
           "of this run; its `LlamaForCausalLM.model` spans all 48 layers. See the script's docstring.", "",
           "| input | modules | budgets GiB | optimal | not proven (gap) | over budget | median s | p90 s | max s (at GiB) |",
           "|---|---:|---|---:|---|---|---:|---:|---|"]
    for r in results:
        unproven = ", ".join(f"{x[0]:.2f} ({x[1].status}, gap {x[1].mip_gap if x[1].mip_gap is None else format(x[1].mip_gap, '.1e')})"
                             for x in r["unproven"]) or "none"
        b, _, s = r["slowest"]
        out.append(f"| {r['label']} | {r['modules']} | {r['low']:.3f} - {r['base']:.3f} | {r['optimal']} of {r['n']} "
                   f"| {unproven} | {', '.join(f'{x[0]:.2f}' for x in r['over']) or 'none'} | {r['median']:.3f} "
                   f"| {r['p90']:.3f} | {s:.3f} ({b:.2f}) |")
    if cert:
        out += ["", "Independent checks on the 96-block stack (HiGHS bound: no plan can cost less; DP alone: the "
                "exact DP with the stack relaxation off and 30x its work allowance):", "",
                "| budget GiB | plan status | plan rc ms | HiGHS count-space bound ms (s) | plan above it | "
                "DP alone rc ms | DP alone status (s) |", "|---:|---|---:|---:|---:|---:|---|"]
        for b, p, bound, bound_s, alone, alone_s in cert:
            out.append(f"| {b:.3f} | {p.status} | {p.recompute_ms:.6f} | {bound:.6f} ({bound_s:.1f}) | "
                       f"{(p.recompute_ms - bound) / p.recompute_ms:.1e} | {alone.recompute_ms:.6f} | "
                       f"{alone.status} ({alone_s:.1f}) |")
    if milp_ref:
        out += ["", "Our MILP engine on the Llama model (what these budgets ran before model-spanning modules were "
                "handled by the DP; 60 s limit):", "",
                "| budget GiB | status | gap | seconds | rc ms | the default plan's rc ms |", "|---:|---|---:|---:|---:|---:|"]
        for b, q, s in milp_ref:
            p = planner.plan(llama, b)
            gap = "-" if q.mip_gap is None else f"{q.mip_gap:.1e}"
            rc = "no plan" if q.recompute_ms is None else f"{q.recompute_ms:.6f}"
            out.append(f"| {b:.3f} | {q.status} | {gap} | {s:.1f} | {rc} | {p.recompute_ms:.6f} |")
    text = "\n".join(out) + "\n"
    print(text)
    if not args.quick:
        write_results(text, REPO / "bench" / "RESULTS.md", SECTION)
        print(f"wrote bench/RESULTS.md ({SECTION[3:]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

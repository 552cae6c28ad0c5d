"""``bench_budget_range.py --collected``: every budget of collected Llama-3 stats and a sweep.

Per input (bench/collected_llama.py): 41 budgets evenly spaced from its
smallest feasible budget to its no-checkpointing peak, each one
``planner.plan`` call on stats freshly parsed from the JSON document (parsing
not timed, nothing shared between calls), wall-clock and process CPU
seconds. Then a 41-point ``planner.sweep`` of the 405B stats at world size
128 against the 41 separate plans. The independent checks of these plans
are bench/bench_collected_checks.py's.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import planner
from bench.bench_budget_range import COLLECTED_SECTION, REPO, budget_range
from bench.bench_planner import machine, write_results
from bench.collected_llama import INPUTS, Input, collected

N_BUDGETS = 41
SWEPT = Input("405b", 128, False)


def _timed_plan(doc: dict, budget: float, world_size: int, **options) -> tuple[planner.Plan, float, float]:
    stats = planner.parse_stats(doc)
    t0, c0 = time.perf_counter(), time.process_time()
    p = planner.plan(stats, budget, world_size=world_size, **options)
    return p, time.perf_counter() - t0, time.process_time() - c0


def run_input(inp: Input, doc: dict, log) -> dict:
    budgets, low, base = budget_range(planner.parse_stats(doc), N_BUDGETS, world_size=inp.world_size)
    rows = []
    for b in budgets:
        p, wall, cpu = _timed_plan(doc, b, inp.world_size)
        rows.append((b, p, wall, cpu))
        log(f"  {inp.label} {b:9.3f} GiB  {p.status:10s} gap {p.mip_gap or 0:.1e}  {wall:.3f} s (cpu {cpu:.3f})")
    walls = sorted(r[2] for r in rows)
    cpus = sorted(r[3] for r in rows)
    proven = [r for r in rows if r[1].status in ("optimal", "infeasible")]
    return {"input": inp, "modules": len(doc["modules"]), "low": low, "base": base, "budgets": budgets,
            "rows": rows, "optimal": len(proven), "worst_gap": max(r[1].mip_gap or 0.0 for r in rows),
            "median": statistics.median(walls), "p90": walls[int(0.9 * (len(walls) - 1))],
            "slowest": max(rows, key=lambda r: r[2]), "cpu_median": statistics.median(cpus),
            "cpu_p90": cpus[int(0.9 * (len(cpus) - 1))], "cpu_max": cpus[-1]}


def run_sweep(doc: dict, result: dict) -> dict:
    """A 41-point sweep over the input's budgets, against its separate plans."""
    stats = planner.parse_stats(doc)
    t0, c0 = time.perf_counter(), time.process_time()
    plans = planner.sweep(stats, result["budgets"], world_size=SWEPT.world_size)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    same = sum(1 for p, r in zip(plans, result["rows"])
               if p.recompute_ms is not None and r[1].recompute_ms is not None
               and abs(p.recompute_ms - r[1].recompute_ms) <= 1e-6 * max(r[1].recompute_ms, 1e-9))
    return {"wall": wall, "cpu": cpu, "optimal": sum(p.status == "optimal" for p in plans), "n": len(plans),
            "same": same, "single_wall": sum(r[2] for r in result["rows"]),
            "single_cpu": sum(r[3] for r in result["rows"])}


def run_collected_bench(args, log) -> int:
    started = time.time()
    head = machine()
    load0 = os.getloadavg()[0]
    folder = args.stats_dir or Path(tempfile.mkdtemp(prefix="sacplan-collected-"))
    folder.mkdir(parents=True, exist_ok=True)
    only = {x for x in args.only.split(",") if x}
    inputs = [inp for inp in INPUTS if not only or inp.file in only]
    results, sweep, collect_s = [], None, {}
    for inp in inputs:
        doc, seconds = collected(inp, folder, log)
        if seconds is not None:
            collect_s[inp.file] = seconds
        results.append(run_input(inp, doc, log))
        if inp == SWEPT:
            sweep = run_sweep(doc, results[-1])
            log(f"  sweep: {sweep}")
    text = _report(head, load0, os.getloadavg()[0], started, results, sweep, collect_s)
    print(text)
    if not only:
        write_results(text, REPO / "bench" / "RESULTS.md", COLLECTED_SECTION)
        print(f"wrote bench/RESULTS.md ({COLLECTED_SECTION[3:]})")
    return 0


def _report(head, load0, load1, started, results, sweep, collect_s) -> str:
    cmd = "python bench/bench_budget_range.py --collected"
    out = [COLLECTED_SECTION, "", f"Machine: {head}", "",
           f"Command: `{cmd}` ({(time.time() - started) / 60:.1f} min in all; 1-min load {load0:.2f} at start, "
           f"{load1:.2f} at the end). Inputs: bench/collected_llama.py (`sacplan collect --hf-config ... --batch 1 "
           "--seq 8192 --target-device H100-SXM`, AdamW; `--world-size N`: unsharded bf16 stats planned with "
           "`world_size=N`; FSDP2 xN: one rank collected with `--fsdp-world-size N --mixed-precision bf16`). "
           f"{N_BUDGETS} budgets per input, evenly spaced from the smallest feasible budget to the no-checkpointing "
           "peak; each is one `planner.plan` call on stats freshly parsed from the document (nothing shared). Seconds: "
           "wall clock; CPU: the process's CPU seconds (the machine is shared: wall time includes waiting for a core)."
           + (f" Collected in this run: {', '.join(f'{k} {v:.0f} s' for k, v in collect_s.items())}." if collect_s
              else ""), "",
           "| input | modules | budgets GiB | proven optimal | worst gap | median s | p90 s | max s (at GiB) | "
           "CPU median / p90 / max s |", "|---|---:|---|---:|---:|---:|---:|---|---|"]
    for r in results:
        b, _, wall, _ = r["slowest"]
        out.append(f"| {r['input'].label} | {r['modules']} | {r['low']:.2f} - {r['base']:.2f} | {r['optimal']} of "
                   f"{len(r['rows'])} | {r['worst_gap']:.1e} | {r['median']:.3f} | {r['p90']:.3f} | {wall:.3f} "
                   f"({b:.1f}) | {r['cpu_median']:.3f} / {r['cpu_p90']:.3f} / {r['cpu_max']:.3f} |")
    if sweep:
        out += ["", f"`planner.sweep` over the same {sweep['n']} budgets of {SWEPT.label}: {sweep['wall']:.2f} s "
                f"wall ({sweep['cpu']:.2f} s CPU), {sweep['optimal']} of {sweep['n']} optimal, {sweep['same']} with "
                f"the recompute of the separate plan; the {sweep['n']} separate plans took {sweep['single_wall']:.1f} s "
                f"wall ({sweep['single_cpu']:.1f} s CPU)."]
    return "\n".join(out) + "\n"

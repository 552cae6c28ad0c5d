"""Offloading on collected Llama-3 8B / 70B stats (H100-SXM): keep / recompute / offload against recompute only.

    python bench/bench_offload_stack.py [--stats-dir /tmp/scale-stats] [--host-link-gbps 50]
                                        [--host-budget-gib 32] [--write]

For each input (bench/collected_llama.py's files: 8B --world-size 2 and FSDP2 x4, 70B --world-size 16 and
FSDP2 x32) and 5 budgets from the smallest one a recompute-only plan meets to just under the no-checkpointing
peak, two ``planner.plan`` calls on the parsed stats, as a user makes them (nothing shared between calls):
``offload='off'`` (the best recompute-only plan) and ``offload='on'`` with the host link at ``--host-link-gbps``
(50 GB/s per direction: PCIe Gen5 x16 on an H100-SXM board, docs/notes' link table; the collected stats carry
no link figure). Printed per budget: the predicted step-time overhead of each plan (recompute, plus offload
stall when on), the plan's status and proven gap, and the CPU seconds of each call. Then 70B FSDP2 x32 at its
two tightest budgets again with a host memory cap (``host_budget_gib``, ``--host-budget-gib``). ``--write``
replaces the subsection "Planner: collected Llama-3 8B/70B" of bench/RESULTS.md's section "Offloading".
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import planner  # noqa: E402

INPUTS = [("8b-ws.json", 2, "Llama-3 8B --world-size 2"), ("8b-fsdp4.json", 1, "Llama-3 8B FSDP2 x4"),
          ("70b-ws.json", 16, "Llama-3 70B --world-size 16"), ("70b-fsdp32.json", 1, "Llama-3 70B FSDP2 x32")]
FRACTIONS = (0.0, 0.25, 0.5, 0.75, 0.95)  # of the way from the smallest recompute-only budget to the baseline peak
SECTION = "## Offloading"
SUBSECTION = "### Planner: collected Llama-3 8B/70B"
GIB = 2**30


def run(stats_dir: Path, gbps: float, time_limit_s: float, log) -> list[str]:
    rows = ["| input | budget GiB | recompute only: ms (status, s) | keep/recompute/offload: ms = recompute + stall "
            "(status, gap, s) | host GiB | saved |", "|---|---|---|---|---|---|"]
    seconds, proven, total = [], 0, 0
    for name, ws, label in INPUTS:
        stats = planner.load_stats(stats_dir / name)
        least = planner.min_feasible_budget_gib(stats, world_size=ws)
        top = planner.plan(stats, 1e6, world_size=ws).baseline_peak_bytes / GIB
        for frac in FRACTIONS:
            budget = round(least + (top - least) * frac, 3)
            t = time.process_time()
            off = planner.plan(stats, budget, world_size=ws)
            t_off = time.process_time() - t
            t = time.process_time()
            on = planner.plan(stats, budget, world_size=ws, offload="on", host_link_gbps=gbps, time_limit_s=time_limit_s)
            t_on = time.process_time() - t
            seconds.append(t_on)
            total += 1
            proven += on.status == "optimal"
            stall = on.offload_stall_ms or 0.0
            overhead = on.step_overhead_ms if on.step_overhead_ms is not None else on.recompute_ms
            saved = f"{100 * (1 - overhead / off.recompute_ms):.1f}%" if off.recompute_ms else "-"
            row = (f"| {label} | {budget:.3f} | {off.recompute_ms:.2f} ({off.status}, {t_off:.3f}) | {overhead:.2f} = "
                   f"{on.recompute_ms:.2f} + {stall:.2f} ({on.status}, {on.mip_gap or 0:.1e}, {t_on:.3f}) | "
                   f"{(on.host_bytes or 0) / GIB:.2f} | {saved} |")
            log(row)
            rows.append(row)
    rows.append("")
    rows.append(f"offload on: {proven} of {total} plans proven optimal; CPU seconds per plan max {max(seconds):.3f}, "
                f"median {statistics.median(seconds):.3f} (targets: max 1.0, median 0.3).")
    return rows


def run_capped(stats_dir: Path, gbps: float, time_limit_s: float, cap_gib: float, log) -> list[str]:
    """70B FSDP2 x32 at its smallest recompute-only budget and one looser one, with a host memory cap."""
    rows = ["| input | budget GiB | host cap GiB | keep/recompute/offload: ms = recompute + stall (status, gap, s) | "
            "host GiB | uncapped: ms (host GiB) |", "|---|---|---|---|---|---|"]
    name, ws, label = INPUTS[-1]
    stats = planner.load_stats(stats_dir / name)
    least = planner.min_feasible_budget_gib(stats, world_size=ws)
    top = planner.plan(stats, 1e6, world_size=ws).baseline_peak_bytes / GIB
    for frac in FRACTIONS[:2]:
        budget = round(least + (top - least) * frac, 3)
        free = planner.plan(stats, budget, world_size=ws, offload="on", host_link_gbps=gbps, time_limit_s=time_limit_s)
        t = time.process_time()
        on = planner.plan(stats, budget, world_size=ws, offload="on", host_link_gbps=gbps, time_limit_s=time_limit_s,
                          host_budget_gib=cap_gib)
        t_on = time.process_time() - t
        stall = on.offload_stall_ms or 0.0
        overhead = on.step_overhead_ms if on.step_overhead_ms is not None else on.recompute_ms
        row = (f"| {label} | {budget:.3f} | {cap_gib:g} | {overhead:.2f} = {on.recompute_ms:.2f} + {stall:.2f} "
               f"({on.status}, {on.mip_gap or 0:.1e}, {t_on:.3f}) | {(on.host_bytes or 0) / GIB:.2f} | "
               f"{free.step_overhead_ms:.2f} ({(free.host_bytes or 0) / GIB:.2f}) |")
        log(row)
        rows.append(row)
    return rows


def write(rows: list[str], header: list[str]) -> None:
    """Replace the subsection (or add it, and the section "## Offloading" if need be) in bench/RESULTS.md."""
    path = REPO / "bench" / "RESULTS.md"
    lines = path.read_text().split("\n")
    block = [SUBSECTION, "", *header, "", *rows]
    if SUBSECTION in lines:
        start = lines.index(SUBSECTION)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(("## ", "### "))), len(lines))
        lines[start:end] = block + [""]
    elif SECTION in lines:
        at = lines.index(SECTION) + 1
        end = next((i for i in range(at, len(lines)) if lines[i].startswith("## ")), len(lines))
        lines[end:end] = block + [""]
    else:
        lines += ["", SECTION, "", *block, ""]
    path.write_text("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stats-dir", type=Path, default=Path("/tmp/scale-stats"))
    ap.add_argument("--host-link-gbps", type=float, default=50.0)
    ap.add_argument("--time-limit-s", type=float, default=20.0, help="per offload plan (the MILP fallback's limit)")
    ap.add_argument("--host-budget-gib", type=float, default=32.0, help="the host memory cap of the capped rows")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    rows = run(args.stats_dir, args.host_link_gbps, args.time_limit_s, print)
    print("\n".join(rows[-1:]))
    rows += ["", f"With a host memory cap (`host_budget_gib`, `--host-budget-gib {args.host_budget_gib:g}`):", "",
             *run_capped(args.stats_dir, args.host_link_gbps, args.time_limit_s, args.host_budget_gib, print)]
    if args.write:
        header = [f"`python bench/bench_offload_stack.py --write` (host link {args.host_link_gbps:g} GB/s per direction, "
                  f"MILP fallback limit {args.time_limit_s:g} s). CPU seconds (`time.process_time`) per `planner.plan` "
                  "call on parsed stats; machine: 2 CPUs (AMD EPYC), shared with other sessions' work running in parallel."]
        write(rows, header)


if __name__ == "__main__":
    main()

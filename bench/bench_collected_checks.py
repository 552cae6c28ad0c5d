"""Independent checks of the planner on collected Llama-3 stats: each plan against a bound no engine of ours proves.

    python bench/bench_collected_checks.py --stats-dir /tmp/scale-stats   # every input; rewrites its RESULTS section
    python bench/bench_collected_checks.py --stats-dir DIR --only 8b-ws.json,405b-fsdp128.json   # prints only

Per input of bench/collected_llama.py (16: Llama-3 8B, 70B, 405B, unsharded
stats planned with ``world_size=N`` and FSDP2 per-rank stats), at the budgets
``INDICES`` of its 41-point range (bench_budget_range.budget_range: the
smallest feasible budget, index 0, up to no checkpointing, index 40; the
indices take in every budget the planner left unproven on some input in
bench/RESULTS.md), one ``planner.plan`` on freshly parsed stats, then:

1. the count-space bound of bench/count_space.py (HiGHS's dual bound on a
   relaxation formulated there from the problem's frontiers and needs, not
   from any engine), first with the last 2 blocks exact, then 4 if that
   does not reach the plan;
2. only where no bound reaches it: our MILP engine (``solver="milp"``, its own
   formulation on HiGHS) with ``--milp-seconds`` (default 120).

Verdicts: **certified** when a bound is within 1e-6 of the plan's recompute (no
plan costs less: it is optimal) or the MILP proves the same optimum;
**DISAGREES** when the plan costs less than a bound (or the relaxation has no
solution at all), when the MILP finds a plan cheaper than the plan's own
proven gap allows, or when the plan's peak is over its budget; otherwise
**not certified**, with the gap between the plan and the best bound found
(where the plan is "feasible" that gap should sit within its stated one).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import planner  # noqa: E402
from bench.bench_budget_range import budget_range  # noqa: E402
from bench.bench_planner import machine, write_results  # noqa: E402
from bench.collected_llama import INPUTS, Input, collected  # noqa: E402
from bench.count_space import GIB, Bound, count_space_bound  # noqa: E402
from planner.solve.problem import prepare  # noqa: E402

SECTION = "## Planner: independent checks on collected Llama-3 stats"
N_BUDGETS = 41
# 0 and 1: the tight end; 18, 21, 25, 26: where the planner left 405B budgets unproven (RESULTS.md); 10, 33: spread
INDICES = (0, 1, 10, 18, 21, 25, 26, 33)
TAILS = ((2, 30.0), (4, 60.0))  # (blocks modelled exactly, HiGHS seconds)
GAP = 1e-6


@dataclass
class Check:
    inp: Input
    index: int
    budget_gib: float
    plan: planner.Plan
    plan_s: float
    bounds: list[Bound]
    milp: planner.Plan | None
    milp_s: float
    verdict: str
    why: str

    @property
    def best_bound(self) -> float:
        return max((b.bound_ms for b in self.bounds if b.bound_ms == b.bound_ms), default=float("nan"))


def check_budget(inp: Input, doc: dict, prob, index: int, budget_gib: float, milp_seconds: float) -> Check:
    """The plan at one budget and the checks on it, until one settles it."""
    t0 = time.perf_counter()
    p = planner.plan(planner.parse_stats(doc), budget_gib, world_size=inp.world_size)
    plan_s = time.perf_counter() - t0
    rc = p.recompute_ms
    if rc is None or p.peak_bytes is None:
        return Check(inp, index, budget_gib, p, plan_s, [], None, 0.0, "DISAGREES", f"no plan ({p.status})")
    if p.peak_bytes > budget_gib * GIB:
        return Check(inp, index, budget_gib, p, plan_s, [], None, 0.0, "DISAGREES",
                     f"peak {p.peak_bytes / GIB:.6f} GiB over the budget")
    bounds: list[Bound] = []
    for tail, seconds in TAILS:
        b = count_space_bound(prob.stats, budget_gib, world_size=inp.world_size, tail_blocks=tail,
                              time_limit_s=seconds, prob=prob)
        bounds.append(b)
        if b.bound_ms > rc * (1 + GAP) + 1e-9:
            return Check(inp, index, budget_gib, p, plan_s, bounds, None, 0.0, "DISAGREES",
                         f"the plan costs less than the bound ({b.status})")
        if b.bound_ms >= rc * (1 - GAP) - 1e-9:
            return Check(inp, index, budget_gib, p, plan_s, bounds, None, 0.0, "certified",
                         f"bound, {tail} blocks exact")
    if milp_seconds <= 0:
        return Check(inp, index, budget_gib, p, plan_s, bounds, None, 0.0, "not certified", _short(p, bounds, None))
    t0 = time.perf_counter()
    q = planner.plan(planner.parse_stats(doc), budget_gib, world_size=inp.world_size, solver="milp",
                     time_limit_s=milp_seconds)
    milp_s = time.perf_counter() - t0
    claimed = (p.mip_gap or 0.0) if p.status != "optimal" else GAP
    if q.recompute_ms is not None and q.recompute_ms < rc * (1 - claimed) - 1e-9:
        verdict, why = "DISAGREES", f"the MILP found {q.recompute_ms:.6f} ms, under the plan's claimed gap"
    elif _milp_bound(q) > rc * (1 + GAP) + 1e-9:
        verdict, why = "DISAGREES", "the plan costs less than the MILP's bound"
    elif _milp_bound(q) >= rc * (1 - GAP) - 1e-9:
        verdict, why = "certified", f"the MILP's {q.status} bound"
    else:
        verdict, why = "not certified", _short(p, bounds, q)
    return Check(inp, index, budget_gib, p, plan_s, bounds, q, milp_s, verdict, why)


def _milp_bound(q: planner.Plan) -> float:
    """What the MILP's plan proves no plan beats (its recompute less its proven gap); nan without a plan."""
    if q.recompute_ms is None or q.status not in ("optimal", "feasible") or q.mip_gap is None:
        return float("nan")
    return q.recompute_ms * (1 - q.mip_gap)


def _short(p: planner.Plan, bounds: list[Bound], q: planner.Plan | None) -> str:
    found = [b.bound_ms for b in bounds] + ([_milp_bound(q)] if q is not None else [])
    best = max([x for x in found if x == x], default=float("nan"))
    gap = (p.recompute_ms - best) / p.recompute_ms
    own = f" (its own stated gap {p.mip_gap:.1e})" if p.status != "optimal" and p.mip_gap else ""
    return f"plan {gap:.1e} above the best bound{own}"


def run(args, log) -> tuple[list[Check], dict]:
    only = {x for x in args.only.split(",") if x}
    checks, seconds = [], {}
    for inp in INPUTS:
        if only and inp.file not in only:
            continue
        t0 = time.perf_counter()
        doc, _ = collected(inp, args.stats_dir, log)
        stats = planner.parse_stats(doc)
        budgets, _, _ = budget_range(stats, N_BUDGETS, world_size=inp.world_size)
        prob = prepare(stats, world_size=inp.world_size)
        for i in INDICES:
            c = check_budget(inp, doc, prob, i, budgets[i], args.milp_seconds)
            checks.append(c)
            bounds = [(b.tail_blocks, round(b.bound_ms, 6), b.status, round(b.seconds, 1)) for b in c.bounds]
            log(f"  {inp.label} [{i}] {c.budget_gib:.3f} GiB: plan {c.plan.recompute_ms} ({c.plan.status}, "
                f"{c.plan_s:.2f} s); bounds {bounds}"
                + (f"; MILP {c.milp.recompute_ms} ({c.milp.status}, {c.milp_s:.1f} s)" if c.milp else "")
                + f": {c.verdict} ({c.why})")
        seconds[inp.file] = time.perf_counter() - t0
    return checks, seconds


def report(head: str, load0: float, load1: float, minutes: float, args, checks: list[Check], seconds: dict) -> str:
    cmd = "python bench/bench_collected_checks.py --stats-dir DIR" + (
        f" --milp-seconds {args.milp_seconds:g}" if args.milp_seconds != 120 else "")
    verdicts = [c.verdict for c in checks]
    out = [SECTION, "", f"Machine: {head}", "",
           f"Command: `{cmd}` ({minutes:.1f} min in all, 1-min load {load0:.2f} at the start and {load1:.2f} at the "
           f"end; per input {min(seconds.values()):.0f}-{max(seconds.values()):.0f} s). The stats: bench/collected_llama.py's "
           f"16 inputs, collected earlier into DIR. Budgets: indices {', '.join(map(str, INDICES))} of each input's "
           f"{N_BUDGETS}-point range (0: the smallest feasible budget; 40: no checkpointing). The plan: one "
           "`planner.plan` on freshly parsed stats (seconds: wall). The bound: bench/count_space.py, HiGHS's dual bound "
           "on a count-space relaxation formulated there (the last blocks exact, 2 then 4 if 2 does not reach the "
           f"plan; the blocks before as integer counts, their needs dropped), which no plan can beat; where no bound "
           f"reaches the plan, our MILP engine (`solver=\"milp\"`, {args.milp_seconds:g} s). Certified: a bound within "
           f"{GAP:g} of the plan's recompute. See the script's docstring for the verdicts.", "",
           f"**{verdicts.count('certified')} of {len(checks)} certified, {verdicts.count('not certified')} not "
           f"certified, {verdicts.count('DISAGREES')} disagree.**", "",
           "| input | budget GiB [index] | plan rc ms (status, gap) | plan s | bound ms (blocks exact, HiGHS, s) | "
           "MILP rc ms (status, gap, s) | verdict |", "|---|---:|---|---:|---|---|---|"]
    for c in checks:
        p = c.plan
        rc = "no plan" if p.recompute_ms is None else f"{p.recompute_ms:.6f}"
        gap = "" if p.mip_gap is None else f", {p.mip_gap:.1e}"
        bounds = "; ".join(f"{b.bound_ms:.6f} ({b.tail_blocks}, {b.status}, {b.seconds:.1f})" for b in c.bounds) or "-"
        milp = "-"
        if c.milp is not None:
            q = c.milp
            milp = ("no plan" if q.recompute_ms is None else f"{q.recompute_ms:.6f}") + \
                f" ({q.status}{'' if q.mip_gap is None else f', {q.mip_gap:.1e}'}, {c.milp_s:.1f})"
        verdict = c.verdict if c.verdict == "certified" else f"**{c.verdict}**: {c.why}"
        out.append(f"| {c.inp.label} | {c.budget_gib:.3f} [{c.index}] | {rc} ({p.status}{gap}) | {c.plan_s:.2f} | "
                   f"{bounds} | {milp} | {verdict} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stats-dir", type=Path, required=True, help="where the collected stats are (collected there "
                    "by bench/collected_llama.py if missing)")
    ap.add_argument("--only", default="", help="comma-separated input files (e.g. 405b-ws.json); prints, writes "
                    "nothing")
    ap.add_argument("--milp-seconds", type=float, default=120.0, help="our MILP's time limit where no bound "
                    "reaches the plan (0: not run)")
    args = ap.parse_args(argv)
    log = lambda s: print(s, flush=True)  # noqa: E731
    started, load0 = time.time(), os.getloadavg()[0]
    head = machine()
    checks, seconds = run(args, log)
    text = report(head, load0, os.getloadavg()[0], (time.time() - started) / 60, args, checks, seconds)
    print(text)
    if not args.only:
        write_results(text, REPO / "bench" / "RESULTS.md", SECTION)
        print(f"wrote bench/RESULTS.md ({SECTION[3:]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How far are the planner's `feasible` plans on deep stacks from the optimum?

    python bench/finish_grid.py            # 96 blocks, the benchmark's three budgets; prints a table
    python bench/finish_grid.py --write    # also writes its section of bench/RESULTS.md

On synthetic stacks of 96 identical blocks the planner's exact search runs out
of work and returns its best plan as `feasible` with a proven gap. This script
asks what that gap hides. For each budget it plans as a user would
(`planner.plan`), then builds the DP's gridded cost-to-go (a proven lower
bound, see docs/memory-model.md) over the frontier points a cheaper plan could
use, at bucket widths from 1 MiB down to 64 KiB. The finer the bucket, the less
the optimistic rounding gives away; at 64 KiB the discards of this model round
by at most 8 bytes each, so the bound there is all but exact. The distance
between the plan and the finest bound is how suboptimal the plan can be.

A 64 KiB bound takes 5-30 s per budget (about a million buckets): that is why
the planner does not build it by default. Expect one to two minutes in all on
2 cores, and about 4 GB of memory.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import planner  # noqa: E402
from bench.bench_planner import _code_state, write_results  # noqa: E402
from bench.synthetic import make_layers  # noqa: E402
from planner.dp import _CostToGo, _fix, _hull_lp, _prepare  # noqa: E402
from planner.lagrange import Lagrange  # noqa: E402
from planner.loader import parse_stats  # noqa: E402
from planner.milp import _reduced_keyneeds, prepare  # noqa: E402

GIB = 2**30
SOURCE = Path("../shared/reference/torch_format_transformer_L12.json")
SECTION = "## Planner: how far deep-stack plans are from the optimum"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=96)
    ap.add_argument("--fractions", default="0.25,0.5,0.75",
                    help="budgets as fractions of the way from the minimum feasible budget to 2%% above baseline")
    ap.add_argument("--widths-kib", default="1024,256,64", help="bucket widths to bound with, KiB")
    ap.add_argument("--write", action="store_true", help="write this section of bench/RESULTS.md")
    args = ap.parse_args(argv)

    src = (REPO / SOURCE) if (REPO / SOURCE).exists() else SOURCE
    stats = parse_stats(make_layers(json.loads(Path(src).read_text()), args.layers))
    probe = planner.plan(stats, 1e-3)
    lo = math.ceil(probe.min_feasible_budget_gib * 1000) / 1000
    hi = math.ceil(probe.baseline_peak_bytes / GIB * 1.02 * 1000) / 1000
    widths = [int(w) * 1024 for w in args.widths_kib.split(",")]
    prob = prepare(stats)
    fr = _prepare(prob)
    rows = []
    for x in (float(v) for v in args.fractions.split(",")):
        budget = round(lo + (hi - lo) * x, 3)
        solve_s = math.inf
        for _ in range(2):  # best of two: the first call in a process pays one-time costs
            t0 = time.perf_counter()
            p = planner.plan(stats, budget)
            solve_s = min(solve_s, time.perf_counter() - t0)
        keyneed = _reduced_keyneeds(prob, budget * GIB)
        _, mu = _hull_lp(fr, prob).duals(keyneed)
        lag = Lagrange(mu, keyneed, fr.starts, fr.d, fr.rc)
        sub, _ = _fix(fr, lag, lag.penalties(), p.recompute_ms)  # the points a cheaper plan may use
        top = float(max(np.max(keyneed), 0.0))
        cells = []
        for eps in widths:
            t0 = time.perf_counter()
            u = _CostToGo(sub, keyneed, float(eps), max(int(math.ceil(top / eps)), 1))
            bound = min(float(u(0, np.zeros(1))[0]), p.recompute_ms)
            cells.append((bound, time.perf_counter() - t0))
            del u
            print(f"  {budget:.3f} GiB, {eps // 1024} KiB: bound {bound:.6f} ms "
                  f"({cells[-1][1]:.1f} s)", file=sys.stderr, flush=True)
        rows.append((budget, p, solve_s, lag.lower, cells))

    head = (f"| budget GiB | status | plan s (best of 2) | plan rc ms | proven gap | LP bound ms | "
            + " | ".join(f"grid bound @{w // 1024} KiB ms (s)" for w in widths)
            + " | plan above finest bound |")
    out = [SECTION, "",
           f"Machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}; "
           f"sacplan planner {planner.PLANNER_VERSION} at {_code_state()}.", "",
           f"Command: `python bench/finish_grid.py --write` (synthetic {args.layers}-block stack of the L12 "
           "sample's block 5, budgets as in the scaling series). `proven gap` is what the planner reports; the "
           "grid bounds are the DP's gridded cost-to-go over the frontier points a cheaper plan could use, "
           "each a proven lower bound on the optimum; the last column is the plan's distance above the finest "
           "one, an upper bound on how suboptimal the plan is.", "",
           head, "|" + "---|" * (head.count("|") - 1)]
    for budget, p, solve_s, lp, cells in rows:
        finest = max(b for b, _ in cells)
        out.append(f"| {budget:.3f} | {p.status} | {solve_s:.2f} | {p.recompute_ms:.6f} | {p.mip_gap:.1e} | "
                   f"{lp:.6f} | " + " | ".join(f"{b:.6f} ({s:.1f})" for b, s in cells)
                   + f" | {(p.recompute_ms - finest) / p.recompute_ms:.1e} |")
    text = "\n".join(out) + "\n"
    print(text)
    if args.write:
        write_results(text, REPO / "bench" / "RESULTS.md", SECTION)
        print("wrote bench/RESULTS.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

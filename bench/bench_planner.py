"""Our planner vs PyTorch's ``sac_milp``, side by side on identical input.

    python bench/bench_planner.py            # full run, writes bench/RESULTS.md
    python bench/bench_planner.py --quick    # a few budgets, ours only on synthetic; prints only

For each input and memory budget (from infeasible up to no checkpointing) both
tools plan, and both plans are *realized* here, from their per-op save lists,
under PyTorch's own memory model (``sac_milp``'s peak formula):

* ours: ``planner.plan`` gives a save list per checkpointed module;
* PyTorch: ``sac_milp`` gives a discard ratio per module, which PyTorch's own
  ``get_optimal_checkpointing_policy_per_module(SACStats, memory_budget=1 - ratio)``
  turns into a save list (as PyTorch's SAC flow does).

Realized recompute = runtime of the ops with decision 0; realized discarded
bytes of a module = ``act_fw_per_module`` - bytes of ops with decision 1;
realized peak = max over modules n of
``TA_n + AG_n - sum(d_j, j before n in forward post-order) + (P_root + TG_n) / world_size``.
The realization reads the raw PyTorch-format JSON, not our loader, so it checks
our reported figures independently. Times are wall-clock seconds of the
``plan``/``sac_milp`` call on this machine; PyTorch's per-module policy time is
reported separately (not counted in the speedup).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import os
import platform
import statistics
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import planner  # noqa: E402
from bench.synthetic import make_layers  # noqa: E402

REFERENCE = Path("../shared/reference")  # relative to the repo root, as the project refers to it
GIB = 2**30
SECTION = "## Planner vs PyTorch sac_milp"
REL_TOL = 1e-6


# ---------------------------------------------------------------- realization


@dataclass
class Realized:
    recompute_ms: float
    peak_bytes: float
    violations: list[str] = field(default_factory=list)


def realize(doc: dict[str, Any], saves: dict[str, list[int]], world_size: int) -> Realized:
    """Recompute time and peak of per-op save lists under PyTorch's memory model."""
    info, sac = doc["module_info"], doc["sac_stats"]
    stats = {m["fqn"]: m for m in info["mod_stats"]}
    root = stats[info["mod_order"]["fw_pre_order"][0]]
    discarded: dict[str, float] = {}
    recompute, bad = 0.0, []
    for fqn, save in saves.items():
        ops = sac[fqn]
        if len(save) != len(ops["memory"]):
            bad.append(f"{fqn}: {len(save)} decisions for {len(ops['memory'])} ops")
            continue
        bad += [f"{fqn}: {v}" for v in _convention_violations(ops, save)]
        recompute += sum(rt for rt, s in zip(ops["runtimes"], save) if s == 0)
        kept = sum(mem for mem, s in zip(ops["memory"], save) if s == 1)
        discarded[fqn] = stats[fqn]["act_fw_per_module"] - kept
    peak, freed = -math.inf, 0.0
    for fqn in info["mod_order"]["fw_post_order"]:
        m = stats[fqn]
        peak = max(peak, m["act_total"] + m["act_grad_per_module"] - freed
                   + (root["param_per_module"] + m["grad_total"]) / world_size)
        freed += discarded.get(fqn, 0.0)
    return Realized(recompute, peak, bad)


def _convention_violations(ops: dict[str, Any], save: list[int]) -> list[str]:
    out = [f"view op {i} saved" for i in ops["view_like_ops"] if save[i] != 0]
    for op, parent in ops["inplace_ops"]:
        if op == parent and save[op] != 1:
            out.append(f"in-place op {op} on an input recomputed")
        elif op != parent and save[op] != save[parent]:
            out.append(f"in-place op {op} differs from parent {parent}")
    rand = [save[i] for i in ops["rand_ops"]]
    if len(set(rand)) > 1 or (ops["force_store_random"] and 0 in rand):
        out.append("random ops split")
    return out


# ---------------------------------------------------------------- the two tools


@dataclass
class Outcome:
    status: str
    seconds: float
    claimed_recompute_ms: float | None = None
    claimed_peak_bytes: float | None = None
    realized: Realized | None = None
    policy_seconds: float = 0.0  # PyTorch only: per-module op policy
    n_modules: int = 0
    note: str = ""
    gap: float | None = None  # ours: the plan's proven gap


REPS = 3  # planner.plan calls per budget; the median is reported


def run_ours(stats: planner.Stats, doc: dict, budget_gib: float, world_size: int) -> Outcome:
    times, p = [], None
    for _ in range(REPS):  # the median of a few calls: one call of ~0.1 s is at the mercy of a shared machine
        t0 = time.perf_counter()
        try:
            q = planner.plan(stats, budget_gib, world_size=world_size)
        except NotImplementedError:
            return Outcome("stub", 0.0)
        times.append(time.perf_counter() - t0)
        if p is not None and (q.status, q.recompute_ms) != (p.status, p.recompute_ms):
            raise RuntimeError(f"planner.plan is not deterministic at {budget_gib} GiB: {p.recompute_ms} vs {q.recompute_ms}")
        p = q
    seconds = statistics.median(times)
    if p.status not in ("optimal", "feasible"):
        note = f"min {p.min_feasible_budget_gib:.3f}" if p.min_feasible_budget_gib is not None else p.message[:40]
        return Outcome(p.status, seconds, note=note)
    saves = {m.fqn: m.save for m in p.modules}
    return Outcome(p.status, seconds, p.recompute_ms, p.peak_bytes, realize(doc, saves, world_size),
                   n_modules=len(p.modules), note=_why(p), gap=p.mip_gap)


def _why(p: planner.Plan) -> str:
    """Gap and cause of a ``feasible`` plan (time limit, or the DP's work limit)."""
    if not p.mip_gap:
        return ""
    cause = next((c for c in ("time limit", "work limit", "state limit") if c in p.message), "")
    return f"gap {p.mip_gap:.1e}" + (f", {cause}" if cause else "")


def torch_module_info(doc: dict) -> dict:
    """PyTorch's ModuleInfo from the JSON (tradeoff_curve back to an OrderedDict); a fresh copy per call
    because ``parse_module_info`` and ``sac_milp`` mutate their input."""
    info = copy.deepcopy(doc["module_info"])
    for m in info["mod_stats"]:
        m["tradeoff_curve"] = OrderedDict((x, y) for x, y in m.get("tradeoff_curve") or [])
    return info


def run_torch(doc: dict, budget_gib: float, world_size: int) -> Outcome:
    from torch.distributed._tools.ilp_utils import parse_module_info
    from torch.distributed._tools.sac_estimator import SACStats
    from torch.distributed._tools.sac_ilp import get_optimal_checkpointing_policy_per_module, sac_milp

    graph = parse_module_info(torch_module_info(doc))
    t0 = time.perf_counter()
    ratios, claimed_ms, claimed_peak = sac_milp(graph, budget_gib, world_size=world_size)
    seconds = time.perf_counter() - t0
    if claimed_peak == -1:
        # sac_milp folds infeasible, time limit without incumbent and solver errors into -1.
        return Outcome("no plan", seconds)
    t1 = time.perf_counter()
    saves = {}
    for fqn, ratio in ratios.items():
        saves[fqn] = get_optimal_checkpointing_policy_per_module(SACStats(**doc["sac_stats"][fqn]), 1 - ratio)
    policy_seconds = time.perf_counter() - t1
    status = "plan" if seconds < 179 else "plan@limit"
    return Outcome(status, seconds, claimed_ms, claimed_peak, realize(doc, saves, world_size), policy_seconds,
                   len(ratios))


# ---------------------------------------------------------------- budgets and rows


def budget_grid(stats: planner.Stats, doc: dict, world_size: int, fractions: list[float]
                ) -> tuple[list[float], float, float | None, float]:
    """One budget 5% below our minimum feasible peak, then ``fractions`` of the way from it to 2% above
    the no-checkpointing peak (0 = the minimum itself, 1 = no checkpointing needed)."""
    baseline = realize(doc, {}, world_size).peak_bytes / GIB
    low, t0 = None, time.perf_counter()
    try:
        low = planner.plan(stats, 1e-3, world_size=world_size).min_feasible_budget_gib
    except NotImplementedError:
        pass
    probe_s = time.perf_counter() - t0
    start = low if low is not None else 0.3 * baseline  # stub planner: a fraction of the baseline
    lo = math.ceil(start * 1000) / 1000
    hi = math.ceil(baseline * 1.02 * 1000) / 1000
    return [math.floor(0.95 * start * 1000) / 1000, *(round(lo + (hi - lo) * x, 3) for x in fractions)], \
        baseline, low, probe_s


def linspace01(n: int) -> list[float]:
    return [k / (n - 1) for k in range(n)]


@dataclass
class Row:
    label: str
    budget_gib: float
    ours: Outcome
    torch: Outcome | None


def _gib(b: float | None) -> str:
    return "-" if b is None else f"{b / GIB:.3f}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _times(x: float) -> str:
    return f"{x:.1f}x" if x < 10 else f"{x:.0f}x"


def _fits(r: Realized | None, budget_gib: float) -> str:
    if r is None:
        return "-"
    return "yes" if r.peak_bytes <= budget_gib * GIB * (1 + 1e-9) else "**NO**"


HEADER = ("| input | ws | budget GiB | ours status | ours s | ours rc claimed ms | ours rc realized ms | ours peak GiB "
          "| fits | torch status | torch s | torch policy s | torch rc claimed ms | torch rc realized ms "
          "| torch peak claimed GiB | torch peak realized GiB | fits | speedup | rc ours - torch ms |")


def row_markdown(r: Row, ws: int) -> str:
    o, t = r.ours, r.torch
    ours = [o.status + (f" ({o.note})" if o.note else ""), f"{o.seconds:.3f}", _ms(o.claimed_recompute_ms),
            _ms(o.realized.recompute_ms if o.realized else None), _gib(o.realized.peak_bytes if o.realized else None),
            _fits(o.realized, r.budget_gib)]
    if t is None:
        theirs = ["not run"] + ["-"] * 7
        speed = diff = "-"
    else:
        theirs = [t.status, f"{t.seconds:.2f}", f"{t.policy_seconds:.2f}", _ms(t.claimed_recompute_ms),
                  _ms(t.realized.recompute_ms if t.realized else None), _gib(t.claimed_peak_bytes),
                  _gib(t.realized.peak_bytes if t.realized else None), _fits(t.realized, r.budget_gib)]
        speed = _times(t.seconds / o.seconds) if o.seconds > 0 else "-"
        diff = (f"{o.realized.recompute_ms - t.realized.recompute_ms:+.2f}"
                if o.realized and t.realized else "-")
    return "| " + " | ".join([r.label, str(ws), f"{r.budget_gib:.3f}", *ours, *theirs, speed, diff]) + " |"


# ---------------------------------------------------------------- the series


def bench_input(label: str, doc: dict, fractions: list[float], world_size: int, torch_budgets: list[int] | None,
                with_sweep: bool, log) -> tuple[list[Row], dict]:
    """Plan every budget with ours, and with PyTorch at the budget indices ``torch_budgets`` (None: all)."""
    t0 = time.perf_counter()
    stats = planner.parse_stats(copy.deepcopy(doc))
    load_s = time.perf_counter() - t0
    budgets, baseline, low, probe_s = budget_grid(stats, doc, world_size, fractions)
    torch_idx = set(range(len(budgets)) if torch_budgets is None else torch_budgets)
    sweep_s = None
    try:
        if not with_sweep:
            raise NotImplementedError
        t0 = time.perf_counter()
        planner.sweep(stats, budgets, world_size=world_size)
        sweep_s = time.perf_counter() - t0
    except NotImplementedError:
        pass
    rows = []
    for k, b in enumerate(budgets):
        ours = run_ours(stats, doc, b, world_size)
        theirs = run_torch(doc, b, world_size) if k in torch_idx else None
        rows.append(Row(label, b, ours, theirs))
        log(row_markdown(rows[-1], world_size))
    meta = {"label": label, "ws": world_size, "modules": len(stats.modules), "load_s": load_s,
            "baseline_gib": baseline, "min_feasible_gib": low, "sweep_s": sweep_s, "n_budgets": len(budgets),
            "probe_s": probe_s}
    return rows, meta


def summarize(rows: list[Row], meta: dict) -> dict:
    ours_s = [r.ours.seconds for r in rows if r.ours.status != "stub"]
    paired = [r for r in rows if r.torch is not None]
    both = [r for r in paired if r.ours.realized and r.torch.realized]
    rel = [abs(r.ours.realized.recompute_ms - r.ours.claimed_recompute_ms) / max(r.ours.realized.recompute_ms, 1e-9)
           for r in rows if r.ours.realized]
    rel_peak = [abs(r.ours.realized.peak_bytes - r.ours.claimed_peak_bytes) / r.ours.realized.peak_bytes
                for r in rows if r.ours.realized]
    return {
        **meta,
        "ours_max_s": max(ours_s, default=None),
        "ours_total_s": sum(ours_s) if ours_s else None,
        "torch_total_s": sum(r.torch.seconds for r in paired) if paired else None,
        "ours_paired_s": sum(r.ours.seconds for r in paired) if paired else None,
        "min_speedup": min((r.torch.seconds / r.ours.seconds for r in paired if r.ours.seconds > 0), default=None),
        "ours_worse_rc": [(r.budget_gib, r.ours.realized.recompute_ms, r.torch.realized.recompute_ms) for r in both
                          if r.ours.realized.recompute_ms > r.torch.realized.recompute_ms * (1 + REL_TOL) + 1e-9],
        "ours_over_budget": [r.budget_gib for r in rows if _fits(r.ours.realized, r.budget_gib) == "**NO**"],
        "torch_over_budget": [r.budget_gib for r in paired if _fits(r.torch.realized, r.budget_gib) == "**NO**"],
        "only_torch_plans": [r.budget_gib for r in paired if r.torch.realized and not r.ours.realized],
        "violations": sorted({v for r in rows for o in (r.ours, r.torch) if o and o.realized
                              for v in o.realized.violations})[:5],
        "max_rel_claim_error": max(rel + rel_peak, default=None),
        "torch_claim_error": max((abs(r.torch.claimed_recompute_ms - r.torch.realized.recompute_ms)
                                  / max(r.torch.realized.recompute_ms, 1e-9) for r in paired if r.torch.realized
                                  and r.torch.realized.recompute_ms > 0), default=None),
    }


def summary_lines(s: dict) -> list[str]:
    f = lambda x, spec=".3f": "-" if x is None else format(x, spec)  # noqa: E731
    sweep = f"sweep() of all budgets {s['sweep_s']:.3f} s." if s["sweep_s"] is not None else "sweep() not run."
    lines = [f"- **{s['label']}** (world_size {s['ws']}, {s['modules']} modules, {s['n_budgets']} budgets): "
             f"baseline peak {s['baseline_gib']:.3f} GiB, our min feasible {f(s['min_feasible_gib'])} GiB; "
             f"load {s['load_s']:.3f} s; finding the min feasible budget {s['probe_s']:.2f} s; "
             f"ours max {f(s['ours_max_s'])} s per budget, {sweep}"]
    if s["torch_total_s"] is not None:
        lines.append(f"  PyTorch sac_milp {s['torch_total_s']:.1f} s vs ours {f(s['ours_paired_s'])} s on the same "
                     f"budgets ({_times(s['torch_total_s'] / s['ours_paired_s'])} overall, min {_times(s['min_speedup'])} "
                     f"per budget); PyTorch's claimed recompute is off its realized by up to "
                     f"{100 * (s['torch_claim_error'] or 0):.1f}%." if s["ours_paired_s"] else
                     f"  PyTorch sac_milp {s['torch_total_s']:.1f} s.")
        lines.append(f"  Budgets where our realized recompute is higher than PyTorch's: "
                     f"{s['ours_worse_rc'] or 'none'}; where only PyTorch has a plan: {s['only_torch_plans'] or 'none'}; "
                     f"PyTorch's realized peak over budget at: {s['torch_over_budget'] or 'none'}.")
    lines.append(f"  Our realized peak over budget at: {s['ours_over_budget'] or 'none'}; "
                 f"max relative |claimed - realized| of ours: {f(s['max_rel_claim_error'], '.1e')}; "
                 f"SAC convention violations: {s['violations'] or 'none'}.")
    return lines


def target_lines(series_rows: dict[tuple[str, int], list[Row]]) -> list[str]:
    """Verdicts on issue 2's targets, from this run's rows."""
    out = []

    def worst(rows: list[Row], limit: float, label: str) -> str:
        timed = [r for r in rows if r.ours.status != "stub"]
        if not timed:
            return f"- {label}: not measured (planner is a stub)."
        over = [r for r in timed if r.ours.seconds > limit]
        w = max(timed, key=lambda r: r.ours.seconds)
        unproven = [r for r in timed if r.ours.status not in ("optimal", "infeasible")]
        if over:
            verdict = f"**not met**: {len(over)} of {len(timed)} budgets over {limit} s"
        elif unproven:
            gaps = [100 * (r.ours.gap or 0.0) for r in unproven]
            verdict = (f"**met in time, not with proven optimality**: {len(unproven)} of {len(timed)} plans are "
                       f"'{unproven[0].ours.status}' (best plan, proven gap {min(gaps):.2f}-{max(gaps):.2f}%)")
        else:
            verdict = "**met**"
        return f"- {label}: {verdict}; slowest {w.ours.seconds:.3f} s at {w.budget_gib:.3f} GiB."

    if ("L12", 1) in series_rows:
        rows = series_rows[("L12", 1)]
        out.append(worst(rows, 0.2, "Every budget of the L12 sample in <= 0.2 s"))
        paired = [r for r in rows if r.torch is not None and r.ours.seconds > 0]
        if paired:
            ratios = [r.torch.seconds / r.ours.seconds for r in paired]
            worse = [r for r in paired if r.ours.realized and r.torch.realized
                     and r.ours.realized.recompute_ms > r.torch.realized.recompute_ms * (1 + REL_TOL) + 1e-9]
            slow = [f"{r.budget_gib:.3f} GiB ({r.ours.seconds:.2f} s vs {r.torch.seconds:.2f} s)"
                    for r in paired if r.ours.seconds > r.torch.seconds]
            overall = sum(r.torch.seconds for r in paired) / sum(r.ours.seconds for r in paired)
            under = [f"{r.budget_gib:.3f}" for r, x in zip(paired, ratios) if x < 50]
            whole, each = overall >= 50 and not worse, min(ratios) >= 50 and not worse
            out.append(f"- >= 50x faster than sac_milp on L12 at equal or lower realized recompute: on the sample as "
                       f"a whole {'**met**' if whole else '**not met**'} ({_times(overall)} in total time), budget by "
                       f"budget {'**met**' if each else '**not met**'} ({_times(min(ratios))} to {_times(max(ratios))}"
                       f"{'; under 50x at ' + ', '.join(under) + ' GiB' if under else ''}); realized recompute "
                       f"{'never higher than' if not worse else 'higher than'} PyTorch's"
                       f"{'' if not worse else ' at ' + ', '.join(f'{r.budget_gib:.3f}' for r in worse)}; "
                       f"slower than sac_milp at: {', '.join(slow) or 'none'}.")
    if ("synthetic 96L", 1) in series_rows:
        out.append(worst(series_rows[("synthetic 96L", 1)], 2.0, "96 layers in <= 2 s per budget"))
    return out


# ---------------------------------------------------------------- machine and output


def machine() -> str:
    import numpy
    import pulp
    import pydantic
    import scipy
    import torch

    cpu = "unknown"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable), {cpu}, shared with other work "
            f"(1-min load {load:.2f} at start); {platform.system()} {platform.release()}; Python "
            f"{platform.python_version()}, numpy {numpy.__version__}, scipy {scipy.__version__} (HiGHS), pydantic "
            f"{pydantic.__version__}, PuLP {pulp.__version__} (bundled CBC), torch {torch.__version__}; sacplan "
            f"planner {planner.PLANNER_VERSION} at {_code_state()}.")


def _code_state() -> str:
    import subprocess

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout

    if os.environ.get("SACPLAN_CODE_STATE"):  # a run from an exported snapshot says which commit it is
        return os.environ["SACPLAN_CODE_STATE"]
    dirty = [x for x in git("status", "--porcelain", "--", "planner").splitlines() if x.strip()]
    head = git("rev-parse", "--short", "HEAD").strip() or "unknown commit"
    return head + (f" + uncommitted edits to {', '.join(x[3:] for x in dirty)}" if dirty else "")


def write_results(text: str, path: Path, section: str = SECTION) -> None:
    """Replace (or append) this benchmark's section of RESULTS.md, leaving other sections alone."""
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    lines, out, skipping = old.splitlines(), [], False
    placed = False
    for line in lines:
        if line.strip() == section:
            out += text.rstrip("\n").splitlines()
            skipping, placed = True, True
            continue
        if skipping and line.startswith("## "):
            skipping = False
            out.append("")
        if not skipping:
            out.append(line)
    if not placed:
        out += ["", *text.rstrip("\n").splitlines()]
    path.write_text("\n".join(out).rstrip("\n") + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few budgets, no PyTorch on the synthetic series, no write")
    ap.add_argument("--write", action="store_true", help="write bench/RESULTS.md even with --quick")
    ap.add_argument("--only", metavar="LABEL", action="append",
                    help="run only the series whose label starts with LABEL (repeatable), e.g. --only L4")
    args = ap.parse_args(argv)
    os.chdir(REPO)
    logging.getLogger("torch.distributed._tools.sac_ilp").disabled = True  # it logs every non-optimal solve

    started = time.time()
    out = [SECTION, "", f"Machine: {machine()}", ""]
    log = lambda s: print(s, flush=True)  # noqa: E731
    samples = [("L4", "torch_format_transformer_L4.json"), ("L12", "torch_format_transformer_L12.json")]
    docs = {name: json.loads((REFERENCE / f).read_text()) for name, f in samples}
    dense = linspace01(6 if args.quick else 13)
    # (label, document, budget fractions, world_size, PyTorch budgets (None = all), also time sweep())
    series = [(name, docs[name], dense, 1, None, True) for name, _ in samples]
    if not args.quick:
        series.append(("L12", docs["L12"], linspace01(7), 4, None, True))
    # Synthetic: one infeasible budget plus 3 interior ones (1 at 200 layers, 1 each in --quick).
    for layers in (8, 96) if args.quick else (8, 32, 96, 200):
        fr = [0.5] if args.quick or layers == 200 else [0.25, 0.5, 0.75]
        torch_k = [] if args.quick else {8: [1, 2, 3], 32: [1, 2]}.get(layers, [])
        series.append((f"synthetic {layers}L", make_layers(docs["L12"], layers), fr, 1, torch_k, False))

    if args.only:
        series = [x for x in series if any(x[0].startswith(o) for o in args.only)]
    log(HEADER)
    rows_md, summaries, series_rows = [], [], {}
    for label, doc, fr, ws, tk, sw in series:
        rows, meta = bench_input(label, doc, fr, ws, tk, sw, log)
        series_rows[(label, ws)] = rows
        rows_md += [row_markdown(r, ws) for r in rows]
        summaries.append(summarize(rows, meta))
    elapsed = time.time() - started
    cmd = "python bench/bench_planner.py" + (" --quick" if args.quick else "") + "".join(
        f" --only {o!r}" for o in args.only or [])
    load_end = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    out += [f"Command: `{cmd}` (from the repo root; {elapsed / 60:.1f} min in all; 1-min load {load_end:.2f} "
            "at the end). Times are wall-clock seconds of "
            f"the median of {REPS} `planner.plan` calls (ours, identical plans each time) and one `sac_milp` call (PyTorch: PuLP model build + CBC at gapRel 0.05, "
            "timeLimit 180 s); PyTorch's per-module op policy (`torch policy s`, one CBC call per checkpointed "
            "module) is extra and not in the speedup. `rc` = recompute time; realized figures are recomputed here "
            "from each tool's per-op save lists under PyTorch's memory model (see the script's docstring). "
            "Budgets: one 5% below our minimum feasible budget, then evenly spaced from that minimum to 2% above the "
            "no-checkpointing peak. Synthetic inputs repeat block 5 of the L12 sample (bench/synthetic.py) and get "
            "the infeasible budget plus the points 25/50/75% of the way (50% only at 200 layers); PyTorch runs on "
            "all three at 8 layers, on 25% and 50% at 32 layers, and not at 96/200 layers, to keep the run "
            "bounded (each sac_milp call may take its full 180 s there); sweep() is timed on the samples only.", "", "### Summary", ""]
    out += ["Targets (issue 2):", "", *target_lines(series_rows), ""]
    for s in summaries:
        out += summary_lines(s)
    out += ["", "### Every budget", "", HEADER, "|" + "---|" * (HEADER.count("|") - 1), *rows_md, ""]
    text = "\n".join(out)
    print()
    print("\n".join(out[: out.index("### Every budget")]))
    if not args.quick or args.write:
        write_results(text, REPO / "bench" / "RESULTS.md")
        print(f"wrote bench/RESULTS.md ({SECTION[3:]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Plans against real CPU training steps: the fidelity model set, predicted vs measured.

    python bench/bench_fidelity.py             # full run, rewrites the "## Fidelity" section of bench/RESULTS.md
    python bench/bench_fidelity.py --quick     # 1 timing repetition; prints, writes nothing (add --write)
    python bench/bench_fidelity.py --only llama --only vit --steps 2

For each model of ``../shared/reference/fidelity`` (settings of its README:
batch 4, seq 256, fp32, CPU, AdamW; ``llama_wide`` batch 1, the ViT batch 8
seq 64): collect stats (``estimators.collect.session.run_collection``, as ``sacplan
collect``), plan at 50%, 75% and 90% of the predicted no-checkpointing peak
(``planner.plan``), apply each plan (``estimators.apply_plan``) to a fresh
model built the same way on the CPU (random weights, same seed), and run real
steps (``estimators.measure.real_step.measure_steps``: forward with the loss, backward,
``AdamW.step()``, ``zero_grad(set_to_none=True)``; AdamW as the collector
models it, ``foreach=False``). Peak = every distinct live storage counted
once (parameters, buffers, inputs, gradients, optimizer state and everything
the step allocates), exact whatever else runs on the machine. Step 1 has no
optimizer state yet; step 2 on is the steady state.

Time: one thread, process CPU time, the baseline and every plan interleaved
(one warm-up step each, then ``--reps`` rounds), medians. Measured
recompute/compute = (forward+backward with the plan - without) / without,
against the plan's ``recompute_ms / compute_ms``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

import planner  # noqa: E402
from bench._machine import describe_machine  # noqa: E402
from bench.bench_planner import write_results  # noqa: E402
from bench.fidelity import (DEFAULT_PLAN_OPTIONS, MODELS, ModelResult, Variant, measured_recompute_ms,  # noqa: E402
                           run_model)

SECTION = "## Fidelity"
REFERENCE = Path("../shared/reference/fidelity")  # relative to the repo root, as the project refers to it
FRACTIONS = [0.5, 0.75, 0.9]
FIRST_STEP_FRACTIONS = [0.75]  # first-step-only plans (of the first step's own baseline)
SIGNIFICANT = 0.05  # recompute time is judged on plans predicted to add at least this much of the step
MIB = 2**20


def _ratio(a: float | None, b: float | None, *, flag_above_one: bool = False) -> str:
    if a is None or not b:
        return "-"
    r = a / b
    return f"**{r:.2f}**" if flag_above_one and r > 1 else f"{r:.2f}"


def _per_step(v: Variant, ref: float | None, *, flag: bool = False) -> str:
    return " / ".join(_ratio(m.peak_bytes, ref, flag_above_one=flag) for m in v.steps) or "-"


def _s1_steady(v: Variant | None, ref_of: str, *, flag: bool = False) -> str:
    """Step 1 and the worst later step, against the budget or the prediction."""
    if v is None or not v.steps:
        return "-" if v is None else "error" if v.error else str(getattr(v.plan, "status", "-"))
    ref = v.budget_bytes if ref_of == "budget" else v.predicted_bytes
    later = max((m.peak_bytes for m in v.steps[1:]), default=None)
    first = _ratio(v.steps[0].peak_bytes, ref, flag_above_one=flag)
    return first if later is None else f"{first} / {_ratio(later, ref, flag_above_one=flag)}"


def _recompute_ms(v: Variant, base: Variant | None) -> tuple[float | None, float | None]:
    """(predicted, measured) ms the plan adds to forward + backward."""
    pred = getattr(v.plan, "recompute_ms", None) if v.plan is not None else None
    meas = measured_recompute_ms(v, base) if base is not None and v is not base else None
    return pred, meas


def _recompute(v: Variant, base: Variant | None) -> str:
    pred, meas = _recompute_ms(v, base)
    if pred is None:
        return "-"
    return f"{pred:.1f} / " + ("-" if meas is None else f"{meas:.1f} ({meas / pred:.2f})" if pred else f"{meas:.1f}")


def recompute_ratios(results: list[ModelResult]) -> list[tuple[str, float]]:
    """measured / predicted recompute ms of every timed plan predicted to add at least SIGNIFICANT of the step."""
    out = []
    for r in results:
        base = next((v for v in r.variants if v.label == "base"), None)
        for v in r.variants:
            pred, meas = _recompute_ms(v, base)
            if v is not base and pred and meas is not None and r.compute_ms and pred >= SIGNIFICANT * r.compute_ms:
                out.append((f"{r.spec.name} {v.label}", meas / pred))
    return out


def summary_row(r: ModelResult) -> str:
    if r.error:
        return f"| {r.spec.name} | {r.error} |" + " |" * (6 + len(FIRST_STEP_FRACTIONS))
    by = {v.label: v for v in r.variants}
    base = by.get("base")
    p50 = by.get("p50")
    cells = [r.spec.name, _s1_steady(base, "pred"), _s1_steady(p50, "pred")]
    cells += [_s1_steady(by.get(f"p{round(f * 100)}"), "budget", flag=True) for f in FRACTIONS]
    for f in FIRST_STEP_FRACTIONS:
        v = by.get(f"f{round(f * 100)}")
        cells.append("-" if v is None else f"{_first(v, v.predicted_bytes)} / {_first(v, v.budget_bytes, flag=True)}"
                     if v.steps else _s1_steady(v, "pred"))
    cells.append(_recompute(p50, base) if p50 is not None else "-")
    return "| " + " | ".join(cells) + " |"


def _first(v: Variant, ref: float | None, *, flag: bool = False) -> str:
    return _ratio(v.steps[0].peak_bytes, ref, flag_above_one=flag) if v.steps else "-"


SUMMARY_HEADER = ("| model | base real/pred s1 / s2+ | p50 real/pred s1 / s2+ | "
                  + " | ".join(f"p{round(f * 100)} real/budget s1 / s2+" for f in FRACTIONS) + " | "
                  + " | ".join(f"f{round(f * 100)} (first step only) real/pred / real/budget s1" for f in
                               FIRST_STEP_FRACTIONS)
                  + " | p50 recompute ms predicted / measured (ratio) |")

DETAIL_HEADER = ("| model | plan | status, modules | budget MiB | predicted peak MiB | real peak MiB by step | "
                 "real/predicted by step | real/budget by step | peak phase by step | recompute ms pred / "
                 "meas (ratio) | step CPU s (fw+bw) | same losses as base |")


def _plan_cell(v: Variant) -> str:
    if v.plan is None:
        return "-"
    status = getattr(v.plan, "status", "?")
    n = len(getattr(v.plan, "modules", None) or [])
    extra = ""
    if status == "infeasible" and getattr(v.plan, "min_feasible_budget_gib", None) is not None:
        extra = f" (min {v.plan.min_feasible_budget_gib * 1024:.1f} MiB)"
    return f"{status}, {n}{extra}"


def detail_rows(r: ModelResult) -> list[str]:
    if r.error:
        return [f"| {r.spec.name} | - | {r.error} |" + " |" * 9]
    base = next((v for v in r.variants if v.label == "base"), None)
    base_losses = [m.loss for m in base.steps] if base else []
    rows = []
    for v in r.variants:
        pred = v.predicted_bytes
        peaks = " / ".join(f"{m.peak_bytes / MIB:.1f}" for m in v.steps) or "-"
        phases = " / ".join(m.peak_phase for m in v.steps) or "-"
        secs = f"{v.step_seconds:.3f} ({v.fwbw_seconds:.3f})" if v.step_seconds is not None else "-"
        same = "-" if v.label == "base" or not v.steps else (
            "yes" if [m.loss for m in v.steps] == base_losses else "**no**")
        budget = "-" if v.label == "base" else f"{v.budget_bytes / MIB:.1f}"
        cells = [r.spec.name, v.label, v.error or _plan_cell(v), budget,
                 f"{pred / MIB:.1f}" if pred else "-", peaks, _per_step(v, pred),
                 "-" if v.label == "base" else _per_step(v, v.budget_bytes, flag=not v.first_step_only), phases,
                 _recompute(v, base), secs, same]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def machine_line() -> str:
    return describe_machine("runs on 1 thread")


def _option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--plan-option must look like KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def recompute_summary(results: list[ModelResult], reps: int) -> list[str]:
    """The recompute-time verdict: measured / predicted over the plans that recompute a significant share."""
    ratios = recompute_ratios(results)
    if not reps or not ratios:
        return []
    values = sorted(x for _, x in ratios)
    inside = sum(0.75 <= x <= 1.33 for x in values)
    return [f"Recompute time, measured / predicted ms, over the {len(values)} plans predicted to add at least "
            f"{SIGNIFICANT:.0%} of the step: median {statistics.median(values):.2f}, range {values[0]:.2f}-"
            f"{values[-1]:.2f}, {inside} of {len(values)} within 0.75-1.33 ("
            + ", ".join(f"{name} {x:.2f}" for name, x in ratios) + ").", ""]


def report(results: list[ModelResult], *, command: str, header: str, options: dict, reps: int, minutes: float) -> str:
    """The markdown section: setup, summary table, every run, notes."""
    out = [SECTION, "", f"Machine: {header}", "",
           f"Command: `{command}` (from the repo root; {minutes:.1f} min in all). Plans: `planner.plan(stats, "
           f"budget{''.join(f', {k}={v!r}' for k, v in options.items())})` at {', '.join(f'{round(f * 100)}%' for f in FRACTIONS)} of the plans' own "
           "predicted no-checkpointing peak. Real peaks are exact (every distinct live storage once, see "
           "`estimators.measure.real_step.measure_steps`); 's2+' is the worst of steps 2 on (the steady state, with AdamW "
           "state); bold: over the budget. "
           + ", ".join(f"f{round(f * 100)}" for f in FIRST_STEP_FRACTIONS)
           + ": planned with `first_step_only=True` at that fraction of the first step's own predicted peak, "
           "held to it on step 1 (later steps hold AdamW's state, which such a plan leaves out). "
           + (f"Times: process CPU seconds, 1 thread, {reps} rounds of interleaved steps (the baseline and every "
              "plan); a plan's measured recompute is the median over rounds of (its forward+backward - the "
              "baseline's in the same round). The memory figures are exact whatever the load; the times are not."
              if reps else "Not timed (--reps 0)."), "",
           *recompute_summary(results, reps), SUMMARY_HEADER, "|" + "---|" * (SUMMARY_HEADER.count("|") - 1),
           *[summary_row(r) for r in results], "", "### Every run", "",
           DETAIL_HEADER, "|" + "---|" * (DETAIL_HEADER.count("|") - 1)]
    for r in results:
        out += detail_rows(r)
    notes = [f"- {r.spec.name}: {r.spec.routing}." for r in results if r.spec.routing]
    models = [r.memory_model for r in results if r.memory_model]
    if models:
        notes.append(f"- The plans' memory_model field: {', '.join(sorted(set(models)))}.")
    return "\n".join(out + ([""] + notes if notes else []) + [""])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", metavar="NAME", action="append", help="run only this model (repeatable)")
    ap.add_argument("--quick", action="store_true", help="1 timing repetition; no write unless --write")
    ap.add_argument("--write", action="store_true", help="write bench/RESULTS.md even with --quick")
    ap.add_argument("--steps", type=int, default=3, help="real steps per run (default 3)")
    ap.add_argument("--benchmark", action="store_true",
                    help="collect with --benchmark (real op times and checkpoint overheads on this CPU)")
    ap.add_argument("--reps", type=int, default=None, help="timing repetitions (default 7, 1 with --quick, 0: none)")
    ap.add_argument("--plan-option", metavar="KEY=VALUE", type=_option, action="append",
                    help=f"a planner.plan option (JSON value), repeatable; default {DEFAULT_PLAN_OPTIONS or 'none'}")
    ap.add_argument("--reference", type=Path, default=REFERENCE, help=f"the fidelity model set (default {REFERENCE})")
    args = ap.parse_args(argv)
    os.chdir(REPO)
    known = {m.name for m in MODELS}
    unknown = sorted(set(args.only or ()) - known)
    if unknown:
        ap.error(f"--only {unknown[0]!r} is not a model of the set ({', '.join(sorted(known))})")
    if args.steps < 1:
        ap.error(f"--steps must be at least 1, got {args.steps}")
    reps = args.reps if args.reps is not None else (1 if args.quick else 7)
    options = dict(args.plan_option) if args.plan_option else {
        k: v for k, v in DEFAULT_PLAN_OPTIONS.items() if k in planner.PlanOptions.model_fields}
    torch.set_num_threads(1)
    header = machine_line()
    started = time.time()
    results = []
    for spec in [m for m in MODELS if not args.only or m.name in args.only]:
        t = time.time()
        results.append(run_model(spec, args.reference, fractions=FRACTIONS, steps=args.steps, reps=reps,
                                 first_step_fractions=FIRST_STEP_FRACTIONS,
                                 options=options, benchmark=args.benchmark))
        print(f"{spec.name}: {time.time() - t:.0f} s", file=sys.stderr, flush=True)
    command = "python bench/bench_fidelity.py" + " ".join(["", *(argv if argv is not None else sys.argv[1:])])
    text = report(results, command=command.strip(), header=header, options=options, reps=reps,
                  minutes=(time.time() - started) / 60)
    print(text)
    if not args.quick or args.write:
        write_results(text, REPO / "bench" / "RESULTS.md", SECTION)
        print(f"wrote bench/RESULTS.md ({SECTION[3:]})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

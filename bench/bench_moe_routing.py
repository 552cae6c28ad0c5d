"""The memory promise of MoE plans under real, data-dependent routing: stats' routing assumption vs the real router.

    python bench/bench_moe_routing.py            # rewrites the "## MoE routing" section of bench/RESULTS.md
    python bench/bench_moe_routing.py --quick    # prints only

The fidelity set's ``mixtral.json`` and ``qwen2_moe.json`` (batch 4, seq 256,
fp32, CPU, AdamW), with Hugging Face's default experts (``grouped_mm``) and
with ``experts_implementation: eager`` (a loop over experts whose shapes are
each expert's token count). First the real routing: one real forward of the
random-weight model (``BUILD_SEED``), every ``aten.topk`` of the routers
counted: the busiest expert's load over its balanced share (tokens x top-k /
experts), the largest over the layers. Then, for each routing the stats can
assume (``--moe-routing balanced``, ``capacity:C`` with C that measured
ratio rounded up to 0.05, ``worst``): collect, plan at 50%, 75% and 90% of
the predicted no-checkpointing peak, apply each plan to the real model and
run 2 real steps (``bench.fidelity.run_model``); real peak / budget, the worst
of the two steps, and real peak - budget in KiB; bold: over the budget.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench.bench_fidelity import FRACTIONS, REFERENCE, machine_line  # noqa: E402
from bench.bench_planner import write_results  # noqa: E402
from bench.fidelity import DEFAULT_PLAN_OPTIONS, ModelResult, ModelSpec, build_real, run_model  # noqa: E402
from estimators.collect import TopKRecorder  # noqa: E402

SECTION = "## MoE routing"
KIB = 2**10


def real_imbalance(spec: ModelSpec) -> float:
    """The largest busiest-expert / balanced-share ratio of one real forward of the random-weight model."""
    built = build_real(spec, REFERENCE)
    watch = TopKRecorder()
    with torch.no_grad(), watch:
        built.model(**built.inputs)
    return max(watch.busiest_over_share())


def _worst_over_budget(r: ModelResult, label: str) -> str:
    v = next((x for x in r.variants if x.label == label), None)
    if v is None or v.error or not v.steps:
        return "-" if v is None else (v.error or str(getattr(v.plan, "status", "-")))
    peak = max(m.peak_bytes for m in v.steps)
    ratio = peak / v.budget_bytes
    over = peak - v.budget_bytes
    text = f"{ratio:.4f} ({over / KIB:+.1f} KiB)"
    return f"**{text}**" if over > 0 else text


def run(quick: bool) -> str:
    rows, started = [], time.time()
    lines = [SECTION, "", f"Machine: {machine_line()}", ""]
    for name in ("mixtral", "qwen2_moe"):
        for impl in ("grouped_mm", "eager"):
            overrides = () if impl == "grouped_mm" else (("experts_implementation", "eager"),)
            base = ModelSpec(name, f"{name}.json", config_overrides=overrides)
            ratio = real_imbalance(base)
            factor = max(1.0, math.ceil(ratio * 20) / 20)
            for routing in ("balanced", f"capacity:{factor:g}", "worst"):
                spec = ModelSpec(name, f"{name}.json", moe_routing=routing, config_overrides=overrides)
                t = time.time()
                r = run_model(spec, REFERENCE, fractions=FRACTIONS, steps=2, reps=0, options=DEFAULT_PLAN_OPTIONS)
                print(f"{name} {impl} {routing}: {time.time() - t:.0f} s", file=sys.stderr, flush=True)
                pred = f"{r.baseline_bytes / 2**20:.1f}" if r.baseline_bytes else "-"
                cells = [name, impl, f"{ratio:.2f}", routing, r.error or pred]
                cells += [_worst_over_budget(r, f"p{round(f * 100)}") for f in FRACTIONS]
                rows.append("| " + " | ".join(cells) + " |")
    header = ("| model | experts | real busiest expert / share | stats assume | predicted baseline MiB | "
              + " | ".join(f"p{round(f * 100)} real/budget (worst step)" for f in FRACTIONS) + " |")
    lines += [f"Command: `python bench/bench_moe_routing.py{' --quick' if quick else ''}` "
              f"({(time.time() - started) / 60:.1f} min). Real peaks exact (`estimators.measure.real_step.measure_steps`), "
              "steps 1 and 2; real/budget (real - budget); bold: over the budget.", "", header, "|" + "---|" * (header.count("|") - 1), *rows, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="print only, write nothing")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    os.chdir(REPO)
    text = run(args.quick)
    print(text)
    if not args.quick:
        write_results(text, REPO / "bench" / "RESULTS.md", SECTION)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

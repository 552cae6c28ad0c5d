"""Pipeline parallel: per-stage plans under the schedule's microbatches in flight, held to a real pipeline.

    python bench/bench_pipeline.py            # print the section
    python bench/bench_pipeline.py --write    # and rewrite the "## Pipeline parallel" section of bench/RESULTS.md

A tiny Llama (from LlamaConfig, random weights) cut into 2 stages, 1F1B and GPipe, 4 microbatches: each stage's stats
collected under fake tensors (``sacplan collect --pp-stages 2 --pp-schedule 1f1b --microbatches 4``), every
stage planned under one budget (``planner.plan_pipeline``) at 60% and 85% of the first stage's baseline and at
the smallest budget every stage fits, each stage's plan applied to its stage (``estimators.apply_plan``) and
the pipeline run for real: ``torch.distributed.pipelining`` (``PipelineStage``, ``Schedule1F1B`` and
``ScheduleGPipe``), one
process per stage, gloo over 127.0.0.1, AdamW, 3 steps. Real peaks: every distinct live storage once, per
rank (``estimators.measure.track_live_storages``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import planner  # noqa: E402
from bench._machine import describe_machine  # noqa: E402
from bench.bench_planner import write_results  # noqa: E402
from estimators.cli.pipeline_verify import run_pipeline  # noqa: E402
from estimators.collect.session import CollectRequest, run_pipeline_collection  # noqa: E402
from estimators.common import PipelineSetup  # noqa: E402

SECTION = "## Pipeline parallel"
CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
          "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64,
          "tie_word_embeddings": False}
BATCH, SEQ, MICROBATCHES, STAGES, STEPS, VIRTUAL = 4, 64, 4, 2, 3, 2
TP = 1  # --tp: ranks of one stage, tensor parallel over them (the model's HF plan)
FRACTIONS = (0.6, 0.85)


def collect(config: dict, schedule: str) -> list[planner.Stats]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "config.json")
        path.write_text(json.dumps(config))
        req = CollectRequest(hf_config=str(path), batch=BATCH, seq=SEQ, pp_stages=STAGES, pp_schedule=schedule,
                             microbatches=MICROBATCHES, pp_virtual_stages=_virtual(schedule), tp_size=TP)
        return [r.stats for r in run_pipeline_collection(req)]


def _virtual(schedule: str) -> int:
    return VIRTUAL if schedule == "interleaved-1f1b" else 1


def budgets(stats: list[planner.Stats]) -> list[tuple[str, float]]:
    """(label, GiB): 60% and 85% of the first stage's baseline, and the smallest budget every stage fits."""
    base = planner.baseline_peak_bytes(stats[0])
    smallest = max(planner.min_feasible_budget_gib(s) for s in stats)
    return [(f"{f:.0%} of stage 0", f * base / planner.GIB) for f in FRACTIONS] + [("smallest", smallest)]


def run(config: dict, schedule: str) -> list[dict]:
    stats = collect(config, schedule)
    setup = PipelineSetup(STAGES, schedule, MICROBATCHES, virtual_stages=_virtual(schedule))
    rows = [{"schedule": schedule, "label": "no plan", "budget_gib": None, "predicted": [planner.baseline_peak_bytes(s) for s in stats],
             "modules": [0] * STAGES, "step_ms": planner.plan_pipeline(stats, 1e3).step_ms,
             "real": run_pipeline(config, setup, batch=BATCH, seq=SEQ, steps=STEPS, tp_size=TP)}]
    for label, gib in budgets(stats):
        pp = planner.plan_pipeline(stats, gib)
        row = {"schedule": schedule, "label": label, "budget_gib": gib, "status": pp.status, "message": pp.message,
               "predicted": [p.peak_bytes for p in pp.stages], "modules": [len(p.modules) for p in pp.stages],
               "step_ms": pp.step_ms, "real": None}
        if pp.status in ("optimal", "feasible"):
            row["real"] = run_pipeline(config, setup, batch=BATCH, seq=SEQ, steps=STEPS, plans=pp.stages,
                                       stats=stats, tp_size=TP)
        rows.append(row)
    return rows


def _same(a: dict, b: dict) -> float:
    """The largest relative difference between two ranks' gradient (sum, norm) pairs."""
    worst = 0.0
    for name, (s, n) in a.items():
        s2, n2 = b[name]
        worst = max(worst, abs(n - n2) / max(n, 1e-12), abs(s - s2) / max(abs(n), 1e-12))
    return worst


def report(rows: list[dict], command: str, minutes: float) -> str:
    bases = {r["schedule"]: r for r in rows if r["label"] == "no plan"}
    lines = [SECTION, "", "Machine: " + describe_machine("every rank a process on 1 thread, gloo over 127.0.0.1"),
             "", f"Command: `{command}` (from the repo root; {minutes:.1f} min in all). A tiny {CONFIG['model_type']} decoder "
             f"(hidden {CONFIG['hidden_size']}, {CONFIG['num_hidden_layers']} layers, vocab {CONFIG['vocab_size']}, "
             f"random weights, seed 0), {STAGES} stages of equal layer counts" + (
                 f", each tensor parallel over {TP} ranks (the model's HF plan, then the stage's plan; collected with "
                 f"`--tp-size {TP}`; rank k holds stage k // {TP}; DTensors count by their local shard)"
                 if TP != 1 else "") + (
                 f" (interleaved: {STAGES} ranks x {VIRTUAL} chunks, rank r holding stages r and r + {STAGES}, "
                 "`ScheduleInterleaved1F1B`; a rank's row is its whole memory)"
                 if any(r["schedule"] == "interleaved-1f1b" for r in rows) else "") + " (embedding with the first, norm and "
             f"head with the last), {' and '.join(sorted({r['schedule'] for r in rows}))}, {MICROBATCHES} microbatches of batch {BATCH} x seq {SEQ}, AdamW "
             f"(`foreach=False`), {STEPS} steps. Predicted: `planner.plan_pipeline` on the stages' stats "
             f"(`sacplan collect --pp-stages {STAGES} --pp-schedule ... --microbatches {MICROBATCHES}`); real: each rank's peak at "
             f"step {STEPS} (the steady state: AdamW state live), every distinct live storage once. Step times are "
             "predicted (CPU roofline cost model), not measured.", "",
             "| schedule | budget | stage | status | modules | predicted peak B | real peak B | real/pred - 1 "
             "| over budget | loss = unplanned | grads max rel diff | predicted step ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    worst, over = 0.0, []
    for row in rows:
        base = bases[row["schedule"]]
        budget = "none" if row["budget_gib"] is None else f"{row['label']}: {row['budget_gib'] * planner.GIB:,.0f} B"
        for k in range(STAGES * TP):  # every rank; with --tp, TP ranks per stage
            s = k // TP
            name = str(s) if TP == 1 else f"{s} (rank {k})"
            pred = row["predicted"][s]
            if row["real"] is None:
                lines.append(f"| {row['schedule']} | {budget} | {name} | {row.get('status')} | - | - | - | - | - | - | - "
                             f"| - |")
                continue
            real = row["real"][k]["peaks"][-1]
            err = real / pred - 1
            worst = max(worst, abs(err))
            is_over = row["budget_gib"] is not None and max(row["real"][k]["peaks"][1:]) > row["budget_gib"] * planner.GIB
            if is_over:
                over.append(f"{row['schedule']} {row['label']} stage {name}")
            loss_same = row["real"][k]["losses"] == base["real"][k]["losses"]
            grads = _same(row["real"][k]["grads"], base["real"][k]["grads"])
            step = "-" if row["step_ms"] is None else f"{row['step_ms']:.3f}"
            lines.append(f"| {row['schedule']} | {budget} | {name} | {row.get('status', '-')} | {row['modules'][s]} | {pred:,} | {real:,} "
                         f"| {err:+.4%} | {'**yes**' if is_over else 'no'} | {'yes' if loss_same else 'no'} "
                         f"| {grads:.1e} | {step} |")
    lines += ["", f"Verdict: worst |real/predicted - 1| {worst:.4%} (goal: within 1%); over the budget: "
              + (", ".join(over) if over else "none") + "."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    global STAGES, MICROBATCHES, BATCH, SECTION, TP  # one configuration per run of the script
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite the section of bench/RESULTS.md")
    ap.add_argument("--schedules", default="1f1b,gpipe", help="comma-separated: 1f1b, gpipe, interleaved-1f1b "
                    f"({VIRTUAL} chunks per rank; its own section) (default 1f1b,gpipe)")
    ap.add_argument("--stages", type=int, default=STAGES, help=f"pipeline stages (default {STAGES}; not 2: its own "
                    "section)")
    ap.add_argument("--microbatches", type=int, default=MICROBATCHES, help=f"default {MICROBATCHES}")
    ap.add_argument("--batch", type=int, default=BATCH, help=f"per microbatch (default {BATCH})")
    ap.add_argument("--family", choices=("llama", "qwen2"), default="llama", help="the decoder's model_type, same "
                    "shape (default llama; not llama: its own section)")
    ap.add_argument("--tp", type=int, default=1, help="ranks per stage, tensor parallel over them (the HF plan; "
                    "default 1; not 1: its own section)")
    ap.add_argument("--layers", type=int, default=CONFIG["num_hidden_layers"], help="decoder layers (default "
                    f"{CONFIG['num_hidden_layers']}; interleaved needs stages x {VIRTUAL})")
    args = ap.parse_args(argv)
    STAGES, MICROBATCHES, BATCH, TP = args.stages, args.microbatches, args.batch, args.tp
    default_layers, CONFIG["num_hidden_layers"] = CONFIG["num_hidden_layers"], args.layers
    CONFIG["model_type"] = args.family
    if STAGES != 2 or args.family != "llama":
        SECTION = f"## Pipeline parallel: {STAGES} stages, {args.family}"
    if STAGES == 2 and MICROBATCHES != 4:  # the matrix's other microbatch count: its own section
        SECTION = f"## Pipeline parallel: {STAGES} stages x {MICROBATCHES} microbatches, {args.family}"
    if STAGES != 2 and args.schedules == "gpipe":  # the 1f1b section of these stages stays as it is
        SECTION = f"## Pipeline parallel: {STAGES} stages, {args.family}, gpipe"
    if "interleaved-1f1b" in args.schedules:
        SECTION = f"## Pipeline parallel: interleaved 1F1B, {STAGES} ranks x {VIRTUAL} chunks, {args.family}"
    if TP != 1:
        SECTION = f"## Pipeline parallel x tensor parallel: {STAGES} stages x TP {TP}, {args.family}"
    t0 = time.perf_counter()
    rows = [row for schedule in args.schedules.split(",") for row in run(CONFIG, schedule)]
    command = "python bench/bench_pipeline.py --write" + (
        f" --stages {STAGES} --microbatches {MICROBATCHES} --batch {BATCH} --schedules {args.schedules}"
        if STAGES != 2 else "") + (f" --family {args.family}" if args.family != "llama" else "") + (
        f" --schedules {args.schedules}" if STAGES == 2 and args.schedules != "1f1b,gpipe" else "") + (
        f" --microbatches {MICROBATCHES} --batch {BATCH}" if STAGES == 2 and MICROBATCHES != 4 else "") + (
        f" --layers {args.layers}" if args.layers != default_layers else "") + (f" --tp {TP}" if TP != 1 else "")
    text = report(rows, command, (time.perf_counter() - t0) / 60)
    print(text)
    if args.write:
        write_results(text, REPO / "bench" / "RESULTS.md", SECTION)
        print(f"wrote bench/RESULTS.md ({SECTION[3:]})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

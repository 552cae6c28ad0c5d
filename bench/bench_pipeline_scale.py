"""Pipeline parallel on paper: Llama-3-70B in 8 stages, per-stage plans against one setting on every stage.

    python bench/bench_pipeline_scale.py [--write]

Collects the 8 stages (``sacplan collect --hf-config <70B shape> --batch 1 --seq 8192 --dtype bf16
--target-device H100-SXM --pp-stages 8 --pp-schedule 1f1b --microbatches 8``), then plans every stage at the
H100's 80 GB (74.5 GiB) with ``world_size=8`` (each stage's parameters, gradients and optimizer state shared
by 8 data-parallel ranks, the planner's ``--world-size``): ``planner.plan_pipeline``. The uniform setting is
what production systems do (one activation-checkpointing config on every stage): stage 0's plan (the stage
holding the most microbatches) copied layer by layer onto every stage. All figures are predicted (H100
roofline cost model), not measured.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import planner  # noqa: E402
from bench.bench_planner import write_results  # noqa: E402

SECTION = "## Pipeline parallel at scale (predicted)"
CONFIG = {"model_type": "llama", "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0,
          "rms_norm_eps": 1e-5, "bos_token_id": 128000, "eos_token_id": 128001, "hidden_size": 8192,
          "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
          "tie_word_embeddings": False}
STAGES, MICROBATCHES, WORLD, BUDGET_GIB = 8, 8, 8, 74.5
_LAYER = re.compile(r"\.layers\.(\d+)")


def collect(out_dir: Path, split: list[str] | None = None) -> list[planner.Stats]:
    from estimators.collect import CollectRequest, run_pipeline_collection

    path = out_dir / "llama3-70b.json"
    path.write_text(json.dumps(CONFIG))
    req = CollectRequest(hf_config=str(path), batch=1, seq=8192, dtype="bf16", target_device="H100-SXM",
                         pp_stages=STAGES, pp_schedule="1f1b", microbatches=MICROBATCHES, pp_split=split)
    return [r.stats for r in run_pipeline_collection(req)]


def _first_layer(stats: planner.Stats) -> int:
    return min(int(m.group(1)) for f in stats.fw_pre_order if (m := _LAYER.search(f)))


def _aligned(planned: planner.PlannedModule, target: planner.ModuleStats) -> list[bool]:
    """The planned save list carried onto ``target``'s ops by name (a stage's first layer runs one op more, a copy
    of the received activation); an op it has beyond the plan's is recomputed."""
    names = [op.name for op in target.ops or []]
    if names == planned.op_names:
        return list(planned.save)
    save = [False] * len(names)
    for tag, i1, i2, j1, _ in difflib.SequenceMatcher(a=planned.op_names, b=names, autojunk=False).get_opcodes():
        if tag == "equal":
            save[j1:j1 + i2 - i1] = planned.save[i1:i2]
    return save


def uniform(stats: list[planner.Stats], reference: planner.Plan) -> tuple[list[float], list[float]]:
    """Stage 0's layer decisions on every stage: each stage's (peak bytes, recompute ms)."""

    base0 = _first_layer(stats[0])
    peaks, recomputes = [], []
    for s in stats:
        shift = _first_layer(s) - base0
        discards, saves, rc = {}, {}, 0.0
        names = set(s.fw_pre_order)
        for m in reference.modules:
            if not _LAYER.search(m.fqn):
                continue  # the embedding and the like: stage 0's own
            fqn = _LAYER.sub(lambda g: f".layers.{int(g.group(1)) + shift}", m.fqn)
            if fqn not in names:
                continue  # the stage has fewer layers
            discards[fqn], saves[fqn], rc = m.discarded_bytes, _aligned(m, s.module(fqn)), rc + m.recompute_ms
        model = planner.memory_model(s, world_size=WORLD)
        peaks.append(model.peak_bytes(discards, saves=saves))
        recomputes.append(rc)
    return peaks, recomputes


def report(stats: list[planner.Stats], minutes: float, pp: planner.PipelinePlan, auto: tuple | None) -> str:
    lines = [SECTION, "", f"Command: `python bench/bench_pipeline_scale.py --write` ({minutes:.1f} min on the "
             "2-core shared CPU, mostly the fake collections: 8 stages, twice with the auto split). " + __doc__.split("\n\n")[2].replace("\n", " "), "",
             "| stage | layers | in flight | baseline GiB | per-stage plan | peak GiB | recompute ms | uniform peak GiB "
             "| uniform recompute ms |", "|---|---|---|---|---|---|---|---|---|"]
    ref = pp.stages[0]
    u_peaks, u_rc = uniform(stats, ref) if ref.status in ("optimal", "feasible") else ([None] * STAGES, [None] * STAGES)
    compute = [planner.compute_ms(s) for s in stats]
    for k, (s, p) in enumerate(zip(stats, pp.stages)):
        layers = sorted({int(m.group(1)) for f in s.fw_pre_order if (m := _LAYER.search(f))})
        peak = "-" if p.peak_bytes is None else f"{p.peak_bytes / planner.GIB:.2f}"
        rc = "-" if p.recompute_ms is None else f"{p.recompute_ms:.0f}"
        up = "-" if u_peaks[k] is None else f"{u_peaks[k] / planner.GIB:.2f}" + (
            " **over**" if u_peaks[k] > BUDGET_GIB * planner.GIB else "")
        ur = "-" if u_rc[k] is None else f"{u_rc[k]:.0f}"
        lines.append(f"| {k} | {layers[0]}-{layers[-1]} | {pp.in_flight[k]} | {p.baseline_peak_bytes / planner.GIB:.2f} "
                     f"| {p.status}, {len(p.modules)} modules | {peak} | {rc} | {up} | {ur} |")
    lines.append("")
    if pp.step_ms is not None and u_rc[0] is not None:
        u_step = planner.pipeline_step_ms([c + r for c, r in zip(compute, u_rc)], MICROBATCHES)
        lines.append(f"Predicted step (sum over stages + (M - 1) x the slowest, docs/pipeline.md): per-stage plans "
                     f"**{pp.step_ms:.0f} ms**, uniform setting {u_step:.0f} ms ({u_step / pp.step_ms:.3f}x); "
                     f"slowest stage {pp.slowest_stage} with per-stage plans. {pp.message}.")
    else:
        lines.append(f"No per-stage plan set: {pp.message}.")
    if auto is not None:
        lines += [""] + auto_lines(pp, *auto)
    return "\n".join(lines)


def auto_lines(equal: planner.PipelinePlan, choice: planner.SplitChoice, exact: planner.PipelinePlan) -> list[str]:
    """The auto split against the equal split: the estimate that chose it, and both collected and planned exactly."""
    sizes = "/".join(str(len(x)) for x in choice.layers)
    def fig(pp: planner.PipelinePlan) -> str:
        return "-" if pp.step_ms is None else f"{pp.step_ms:.0f}"
    lines = ["### Auto split (`--pp-split auto --budget-gib 74.5`, predicted)", "",
             "The split chosen with the per-stage plans from the equal split's collection (`planner."
             "choose_pipeline_split`: each layer's figures, the recompute a layer needs for the share it must "
             "discard calibrated by the equal split's exact plans), then collected with that split and every "
             "stage planned exactly (`planner.plan_pipeline`, `world_size=8`). Predicted (H100 roofline), not "
             "measured.", "",
             "| split | layers per stage | estimated step ms | exact per-stage plans: step ms | slowest stage | "
             "stage ms |", "|---|---|---|---|---|---|",
             f"| equal | {'/'.join(['10'] * STAGES)} | {choice.equal_step_ms:.0f} | {fig(equal)} | {equal.slowest_stage} "
             f"| {', '.join(f'{t:.0f}' for t in equal.stage_ms)} |",
             f"| auto: {', '.join(x.split('.')[-1] for x in choice.split)} | {sizes} | {choice.step_ms:.0f} "
             f"| {fig(exact)} | {exact.slowest_stage} | {', '.join('-' if t is None else f'{t:.0f}' for t in exact.stage_ms)} |", ""]
    if exact.step_ms is not None and equal.step_ms is not None:
        lines.append(f"Auto split vs equal split, exact per-stage plans: {equal.step_ms / exact.step_ms:.3f}x "
                     f"({exact.status}; {exact.message}).")
    else:
        lines.append(f"The auto split has no exact plan set: {exact.message}.")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--no-auto", action="store_true", help="leave out the auto split (its collection)")
    ap.add_argument("--stats", nargs="*", help="the 8 stage files, already collected (default: collect them)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        stats = [planner.load_stats(p) for p in args.stats] if args.stats else collect(Path(tmp))
        pp = planner.plan_pipeline(stats, BUDGET_GIB, world_size=WORLD, time_limit_s=120)
        auto = None
        if not args.no_auto:
            choice = planner.choose_pipeline_split(stats, BUDGET_GIB, world_size=WORLD, equal_plan=pp)
            exact = planner.plan_pipeline(collect(Path(tmp), choice.split), BUDGET_GIB, world_size=WORLD,
                                          time_limit_s=120)
            auto = (choice, exact)
    text = report(stats, (time.perf_counter() - t0) / 60, pp, auto)
    print(text)
    if args.write:
        write_results(text, REPO / "bench" / "RESULTS.md", SECTION)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

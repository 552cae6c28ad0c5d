"""Per-rank plans against real tensor-parallel training: predicted vs measured peak on every rank and step.

    python bench/bench_tensor_parallel.py --write     # rewrites the "## Tensor parallel" section of bench/RESULTS.md
    python bench/bench_tensor_parallel.py             # prints the section only
    python bench/bench_tensor_parallel.py --only qwen2-tp2-sp --only qwen2-fsdp2-tp2 --write
                                                      # runs those jobs only; --write replaces their tables alone
    python bench/bench_tensor_parallel.py --compiled --write   # the llama at TP x2 compiled (aot_eager), with and
                                                      # without sequence parallel: their tables alone

A small Llama (``LlamaConfig``, random weights, no dropout; the model's Hugging Face TP plan mapped onto
``parallelize_module``) and a Qwen2 parallelized by a user's function (``bench/parallelize/qwen2_tp.py``),
each at TP x2 and at FSDP2 x2 x TP x2 on 4 ranks, and both with sequence parallel and attention dropout 0.1
(the Llama's derived from its HF plan, the Qwen2's by ``bench/parallelize/qwen2_tp_sp.py``, each projection
gathering its input, and by ``bench/parallelize/qwen2_tp_sp_blocks.py``, torchtitan's way: attention and the MLP
gathering theirs in ``PrepareModuleInput``), at TP x2 and at FSDP2 x2 x TP x2 too, are collected as one rank of the job under the fake process group
(``run_collection``, as ``sacplan collect --tp-size 2 [--fsdp-world-size 2] [--sequence-parallel]
[--parallelize ...]``), planned at 60% and 85% of the per-rank baseline and at
the smallest feasible budget, then trained for real on 2 or 4 gloo ranks of this
CPU (``bench/tp_run.py``: TP, then the plan, AdamW, three steps; every
distinct live storage once, DTensors by their local shard). Each rank's
steady-state peak (steps 2 and 3) is set against the plan's predicted peak,
and each planned run's gradients (one seeded step) against the unplanned TP
run's, rank by rank.
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

import torch  # noqa: E402

import planner  # noqa: E402
from bench._machine import describe_machine  # noqa: E402
from bench.bench_planner import write_results  # noqa: E402
from bench.tp_run import TpRun, run_tp  # noqa: E402
from estimators import CollectRequest, run_collection, run_ranks  # noqa: E402

SECTION = "## Tensor parallel"
LLAMA = {"model_type": "llama", "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}
LLAMA_DROPOUT = {**LLAMA, "attention_dropout": 0.1}  # sequence parallel: dropout masks drawn per rank, replayed
QWEN2 = {**LLAMA, "model_type": "qwen2"}  # q, k, v with biases: parallelized by a user's function
QWEN2_DROPOUT = {**QWEN2, "attention_dropout": 0.1}
QWEN2_TP = str(REPO / "bench" / "parallelize" / "qwen2_tp.py") + ":parallelize"
QWEN2_TP_SP = str(REPO / "bench" / "parallelize" / "qwen2_tp_sp.py") + ":parallelize"
QWEN2_TP_SP_BLOCKS = str(REPO / "bench" / "parallelize" / "qwen2_tp_sp_blocks.py") + ":parallelize"
BATCH, SEQ, TP = 4, 128, 2
FRACTIONS = (0.6, 0.85)
# subsections of the section that other runs write (bench/bench_torchtitan.py's environment has torchtitan): kept
CARRIED = ("### torchtitan's Llama 3",)
GIB = 2**30


def plans(stats: planner.Stats) -> list[tuple[str, float, planner.Plan]]:
    """(label, budget in GiB, plan) at each fraction of the baseline and at the smallest feasible budget."""
    base = planner.plan(stats, 1024.0).baseline_peak_bytes
    out = [(f"p{round(f * 100)}", base * f / GIB, planner.plan(stats, base * f / GIB)) for f in FRACTIONS]
    smallest = planner.min_feasible_budget_gib(stats)
    out.append(("min", smallest, planner.plan(stats, smallest)))
    return out


def run(stats_dir: Path, name: str) -> tuple[str, bool]:
    """The table of the job ``name`` of :data:`JOBS` (TP x2, FSDP2 over it or not, sequence parallel or not), and
    whether every run held (within 1%, never over its budget, gradients equal)."""
    fsdp, config, parallelize, sequence_parallel, note = JOBS[name]
    compile_backend = COMPILED_JOBS.get(name)
    t = time.perf_counter()
    stats = run_collection(CollectRequest(hf_config=config, batch=BATCH, seq=SEQ, tp_size=TP, parallelize=parallelize,
                                          fsdp_world_size=fsdp if fsdp > 1 else None,
                                          sequence_parallel=sequence_parallel, compile_backend=compile_backend)).stats
    collect_s = time.perf_counter() - t
    stats_path = stats_dir / f"tp_stats_{name}.json"
    stats_path.write_text(json.dumps(stats.model_dump(mode="json")))
    base = planner.plan(stats, 1024.0).baseline_peak_bytes
    chosen = plans(stats)
    job = {"tp_size": TP, "fsdp_size": fsdp, "parallelize": parallelize, "sequence_parallel": sequence_parallel,
           "compile_backend": compile_backend}
    runs = [TpRun("base", config, BATCH, SEQ, **job)]
    predicted = {"base": (base, None)}
    rows, ok = [], True
    for label, budget, p in chosen:
        if p.status not in ("optimal", "feasible"):
            rows.append(f"| {label} | {budget * GIB:,.0f} | {p.status} | | | | |")
            continue
        runs.append(TpRun(label, config, BATCH, SEQ, **job, plan=p.model_dump(mode="json"), stats_path=str(stats_path)))
        predicted[label] = (p.peak_bytes, budget * GIB)
    t = time.perf_counter()
    ranks = run_ranks(run_tp, TP * fsdp, runs)
    ranks_s = time.perf_counter() - t
    for rank, results in enumerate(ranks):
        base_grads = results[0].grads
        for res in results:
            pred, budget = predicted[res.label]
            if res.error:
                rows.append(f"| {res.label} | rank {rank} | error: {res.error} | | | | |")
                ok = False
                continue
            steady = res.peaks[1:]
            ratios = [m / pred for m in steady]
            over = budget is not None and max(res.peaks) > budget
            grads_equal = all(torch.equal(a, b) for a, b in zip(base_grads, res.grads))
            ok = ok and all(abs(r - 1) <= 0.01 for r in ratios) and not over and grads_equal
            rows.append(f"| {res.label} | {'' if budget is None else f'{budget:,.0f}'} | rank {rank} | {pred:,} | "
                        f"{', '.join(f'{m:,}' for m in res.peaks)} | {', '.join(f'{r:.4f}' for r in ratios)} | "
                        f"{'OVER' if over else 'no'} | {'equal' if grads_equal else 'DIFFER'} |")
    job = (f"{config['model_type']}, " + (f"TP x{TP}" if fsdp == 1 else f"FSDP2 x{fsdp} x TP x{TP}")
           + (f" with sequence parallel, attention dropout {config['attention_dropout']}" if sequence_parallel else "")
           + note)
    flags = (f"--tp-size {TP}" + (f" --fsdp-world-size {fsdp}" if fsdp > 1 else "")
             + (" --sequence-parallel" if sequence_parallel else "")
             + (f" --parallelize {Path(parallelize).relative_to(REPO).as_posix()}" if parallelize else "")
             + (f" --compile-backend {compile_backend}" if compile_backend else ""))
    how = "a user's function" if parallelize else "the HF plan"
    compiled = (f", then torch.compile(model, backend={compile_backend!r}) (the plan checked under it first)"
                if compile_backend else "")
    text = "\n".join([
        f"### {job}", "", describe_machine(f"`{COMMAND} --only {name}`"), "",
        f"One rank of {job} collected under the fake process group in {collect_s:.1f} s ({how}, "
        f"`sacplan collect {flags}`); the real job: {TP * fsdp} gloo ranks on 127.0.0.1, TP then the plan"
        f"{', then fully_shard per decoder layer and the root' if fsdp > 1 else ''}{compiled}, 3 steps "
        f"({ranks_s:.0f} s for "
        f"all runs).", "",
        "| run | budget (bytes) | rank | predicted peak | real peaks, steps 1-3 | ratio, steady state | over budget | "
        "gradients |",
        "|---|---|---|---|---|---|---|---|",
        *rows, "",
        f"All runs within 1%, never over budget, gradients equal: {'yes' if ok else 'NO'}.", "",
        *([without_sequence_parallel(name, base), ""] if sequence_parallel and parallelize is None
          and not compile_backend else []),
        *([COMPILED_NOTE, ""] if compile_backend else [])])
    return text, ok


def without_sequence_parallel(name: str, base: int) -> str:
    """A sentence setting the job's per-rank baseline ``base`` against the same job collected without sequence
    parallel (the HF plan as it is)."""
    fsdp, config, _, _, _ = JOBS[name]
    stats = run_collection(CollectRequest(hf_config=config, batch=BATCH, seq=SEQ, tp_size=TP,
                                          fsdp_world_size=fsdp if fsdp > 1 else None)).stats
    plain = planner.plan(stats, 1024.0).baseline_peak_bytes
    return (f"For comparison, the same job collected without sequence parallel: baseline {plain:,} bytes per rank, "
            f"{plain / base - 1:.0%} above the sequence-parallel rank's {base:,}: the residual stream, the norms and "
            f"the layers' inputs are on seq / {TP} tokens.")


BLOCKS = ", gathered per block (PrepareModuleInput)"
JOBS = {  # name -> (FSDP2 degree, config, the user's function or None for the HF plan, sequence parallel, title note)
    "llama-tp2": (1, LLAMA, None, False, ""),
    "llama-fsdp2-tp2": (2, LLAMA, None, False, ""),
    "qwen2-tp2": (1, QWEN2, QWEN2_TP, False, ""),
    "qwen2-fsdp2-tp2": (2, QWEN2, QWEN2_TP, False, ""),
    "llama-tp2-sp": (1, LLAMA_DROPOUT, None, True, ""),
    "qwen2-tp2-sp": (1, QWEN2_DROPOUT, QWEN2_TP_SP, True, ""),
    "qwen2-tp2-sp-blocks": (1, QWEN2_DROPOUT, QWEN2_TP_SP_BLOCKS, True, BLOCKS),
    "llama-fsdp2-tp2-sp": (2, LLAMA_DROPOUT, None, True, ""),
    "qwen2-fsdp2-tp2-sp": (2, QWEN2_DROPOUT, QWEN2_TP_SP, True, ""),
    "qwen2-fsdp2-tp2-sp-blocks": (2, QWEN2_DROPOUT, QWEN2_TP_SP_BLOCKS, True, BLOCKS),
}
COMPILED = ", compiled (aot_eager)"
JOBS.update({"llama-tp2-compiled": (1, LLAMA, None, False, COMPILED),
             "llama-tp2-sp-compiled": (1, LLAMA_DROPOUT, None, True, COMPILED)})
COMPILED_JOBS = {"llama-tp2-compiled": "aot_eager", "llama-tp2-sp-compiled": "aot_eager"}  # name -> backend
COMPILED_NOTE = ("Planned runs peak under their prediction, some by more than 1%: not explained yet. As for "
                 "compiled plans "
                 "without TP (docs/apply.md, \"Memory under compile\"), what the compiled step keeps inside a planned "
                 "module and where the partitioner's recompute temporaries sit in the backward are not modelled; the "
                 "unplanned compiled step is predicted to the byte.")
SEQUENCE_PARALLEL_JOBS = tuple(name for name, job in JOBS.items() if job[3] and name not in COMPILED_JOBS)
COMMAND = "PYTHONPATH=. OMP_NUM_THREADS=1 python bench/bench_tensor_parallel.py"


def tables(stats_dir: Path, names: list[str]) -> list[tuple[str, bool]]:
    """The named jobs' tables, in :data:`JOBS`' order."""
    unknown = sorted(set(names) - set(JOBS))
    if unknown:
        raise SystemExit(f"--only {unknown[0]!r}: not a job here (the jobs: {', '.join(JOBS)})")
    return [run(stats_dir, name) for name in JOBS if name in names]


def head() -> list[str]:
    """The section's title and what every table has in common."""
    return [SECTION, "",
            f"Llama and Qwen2 of {LLAMA['hidden_size']} hidden, {LLAMA['num_hidden_layers']} layers, batch {BATCH}, "
            f"seq {SEQ}, fp32, AdamW, no dropout but in the sequence-parallel jobs. Peak: every distinct live storage "
            f"once, DTensors by their local shard (estimators.measure_steps). Ratio: real / predicted on steps 2 and "
            f"3 (AdamW state live). Gradients: one seeded step, every local shard against the unplanned parallel "
            f"run's (torch.equal). Each table names the machine and the command that made it.", ""]


def write_tables(texts: list[str], path: Path) -> None:
    """Replace each table's ``### `` subsection of the section in ``path`` (or add it at the section's end)."""
    lines = path.read_text().splitlines()
    if SECTION not in (line.strip() for line in lines):
        write_results("\n".join(head() + texts), path, SECTION)
        return
    for text in texts:
        title = text.splitlines()[0]
        lines = path.read_text().splitlines()
        start = next(k for k, line in enumerate(lines) if line.strip() == SECTION)
        end = next((k for k in range(start + 1, len(lines)) if lines[k].startswith("## ")), len(lines))
        at = next((k for k in range(start, end) if lines[k].strip() == title), None)
        if at is None:
            new = lines[:end] + text.rstrip("\n").splitlines() + [""] + lines[end:]
        else:
            stop = next((k for k in range(at + 1, end) if lines[k].startswith("### ")), end)
            new = lines[:at] + text.rstrip("\n").splitlines() + [""] + lines[stop:]
        path.write_text("\n".join(new).rstrip("\n") + "\n")


def carried_subsection(results: str, heading: str) -> str:
    """``heading``'s subsection of ``results`` (to the next ``##`` or ``###`` heading), or "" if there is none."""
    lines = results.splitlines()
    if heading not in lines:
        return ""
    start = lines.index(heading)
    end = next((k for k in range(start + 1, len(lines)) if lines[k].startswith(("## ", "### "))), len(lines))
    return "\n" + "\n".join(lines[start:end]).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite the section in bench/RESULTS.md (with --only: "
                    "those jobs' tables only)")
    ap.add_argument("--only", metavar="JOB", action="append", choices=list(JOBS),
                    help=f"run only this job (repeatable): {', '.join(JOBS)}")
    ap.add_argument("--only-sequence-parallel", action="store_true",
                    help=f"run only the sequence-parallel jobs ({', '.join(SEQUENCE_PARALLEL_JOBS)}); as --only each")
    ap.add_argument("--compiled", action="store_true",
                    help=f"run only the jobs compiled with aot_eager ({', '.join(COMPILED_JOBS)}); as --only each")
    args = ap.parse_args(argv)
    names = (list(args.only or []) + (list(SEQUENCE_PARALLEL_JOBS) if args.only_sequence_parallel else [])
             + (list(COMPILED_JOBS) if args.compiled else []))
    with tempfile.TemporaryDirectory(prefix="sacplan-tp-") as tmp:
        made = tables(Path(tmp), names or list(JOBS))
    texts = [t for t, _ in made]
    print("\n".join((head() if not names else []) + texts))
    if args.write:
        if names:
            write_tables(texts, REPO / "bench" / "RESULTS.md")
        else:
            path = REPO / "bench" / "RESULTS.md"
            old = path.read_text()
            write_results("\n".join(head() + texts) + "".join(carried_subsection(old, h) for h in CARRIED), path,
                          SECTION)
    return 0 if all(ok for _, ok in made) else 1


if __name__ == "__main__":
    raise SystemExit(main())

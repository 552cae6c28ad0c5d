"""torchtitan's Llama 3 debug model at TP x2: sacplan's per-rank plans against a real 2-rank gloo job.

Run in an environment where torchtitan is installed (docs/tensor-parallel.md, "torchtitan's way"), from the
repo root: ``PYTHONPATH=. SACPLAN_TT_ATTENTION=sdpa python bench/bench_torchtitan.py``. One rank is collected
(``bench/torchtitan_llama.py:make_model``, torchtitan's own TP step through
``bench/parallelize/torchtitan_llama.py:parallelize``, sequence parallel on: torchtitan's default), planned at
60% and 85% of its baseline and at the smallest feasible budget, then each plan is applied to the real model
(torchtitan's registry, its ``init_weights``, its TP, then ``apply_plan``) on 2 gloo ranks and trained 3 AdamW
steps; the table is printed (the same columns as bench_tensor_parallel's).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

import planner  # noqa: E402
from bench.bench_tensor_parallel import GIB, plans  # noqa: E402
from bench.tp_run import BUILD_SEED, TpRankResult, TpRun, measure_run  # noqa: E402
from estimators import CollectRequest, run_collection, run_ranks  # noqa: E402

FACTORY = str(REPO / "bench" / "torchtitan_llama.py") + ":make_model"
PARALLELIZE = str(REPO / "bench" / "parallelize" / "torchtitan_llama.py") + ":parallelize"
BATCH, SEQ, TP = 4, 512, 2


class _Built:
    def __init__(self, model: Any, inputs: Any, loss_fn: Any) -> None:
        self.model, self.inputs, self.loss_fn = model, inputs, loss_fn


def _build(run: TpRun, tp_mesh: Any) -> _Built:
    """torchtitan's model with its own initialization (seed ``BUILD_SEED``, every rank alike), its TP, the plan."""
    from bench.parallelize.torchtitan_llama import parallelize
    from bench.torchtitan_llama import make_model
    from estimators import apply_plan

    torch.manual_seed(BUILD_SEED)
    model, inputs, loss_fn = make_model(run.batch, run.seq, torch.float32, torch.device("cpu"))
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))
    model.train()
    parallelize(model, tp_mesh)
    if run.plan is not None:
        apply_plan(model, run.plan, stats=json.loads(Path(run.stats_path).read_text()))
    return _Built(model, inputs, loss_fn)


def run_tt(rank: int, world_size: int, runs: list[TpRun]) -> list[TpRankResult]:
    """Every run on this rank (``run_ranks`` calls it on each of the 2 ranks)."""
    from estimators import ParallelDims, SettledFunctionalCollectives

    mesh = ParallelDims(tp_size=world_size).make_mesh("cpu")
    out = []
    for run in runs:
        try:
            built = _build(run, mesh["tp"])
            with SettledFunctionalCollectives():
                out.append(measure_run(run, built))
        except Exception as exc:  # noqa: BLE001 (a failed run is a row of the table)
            if os.environ.get("SACPLAN_TT_TRACEBACK"):
                import traceback
                traceback.print_exc()
            out.append(TpRankResult(run.label, error=f"{type(exc).__name__}: {exc}"[:300]))
    return out


def main() -> int:
    if os.environ.get("SACPLAN_TT_ATTENTION") != "sdpa":
        print("set SACPLAN_TT_ATTENTION=sdpa: FlexAttention has no CPU backward (docs/tensor-parallel.md)")
        return 2
    t = time.perf_counter()
    stats = run_collection(CollectRequest(model=FACTORY, batch=BATCH, seq=SEQ, tp_size=TP, parallelize=PARALLELIZE,
                                          sequence_parallel=True)).stats
    collect_s = time.perf_counter() - t
    stats_path = Path(tempfile.mkdtemp()) / "tt_stats.json"
    stats_path.write_text(json.dumps(stats.model_dump(mode="json")))
    base = planner.plan(stats, 1024.0).baseline_peak_bytes
    runs = [TpRun("base", {}, BATCH, SEQ, tp_size=TP)]
    predicted = {"base": (base, None)}
    for label, budget, p in plans(stats):
        if p.status in ("optimal", "feasible"):
            runs.append(TpRun(label, {}, BATCH, SEQ, tp_size=TP, plan=p.model_dump(mode="json"),
                              stats_path=str(stats_path)))
            predicted[label] = (p.peak_bytes, budget * GIB)
    t = time.perf_counter()
    ranks = run_ranks(run_tt, TP, runs)
    ranks_s = time.perf_counter() - t
    print(f"collected in {collect_s:.1f} s; {len(runs)} runs on {TP} gloo ranks in {ranks_s:.0f} s\n")
    print("| run | budget (bytes) | rank | predicted peak | real peaks, steps 1-3 | ratio, steady state | "
          "over budget | gradients |\n|---|---|---|---|---|---|---|---|")
    for rank, results in enumerate(ranks):
        for res in results:
            pred, budget = predicted[res.label]
            if res.error:
                print(f"| {res.label} | | rank {rank} | error: {res.error} | | | | |")
                continue
            ratios = [m / pred for m in res.peaks[1:]]
            over = budget is not None and max(res.peaks) > budget
            equal = all(torch.equal(a, b) for a, b in zip(results[0].grads, res.grads))
            print(f"| {res.label} | {'' if budget is None else f'{budget:,.0f}'} | rank {rank} | {pred:,} | "
                  f"{', '.join(f'{m:,}' for m in res.peaks)} | {', '.join(f'{r:.4f}' for r in ratios)} | "
                  f"{'OVER' if over else 'no'} | {'equal' if equal else 'DIFFER'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

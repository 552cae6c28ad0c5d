"""FSDP2 with gradient accumulation (issue 27, item 1): real 2-rank gloo steps of 2 micro-batches against the plan.

    python bench/bench_fsdp_accumulation.py            # prints the table
    python bench/bench_fsdp_accumulation.py --write    # also writes its section of bench/RESULTS.md

One rank's stats of the loop (``sacplan collect --fsdp-world-size 2
--grad-accumulation 2``: the tests' tiny Llama, batch 4 x 64 per
micro-batch, fp32, AdamW), planned at the smallest feasible budget and at
50%, 75% and 90% of the predicted baseline; each plan applied before
``fully_shard`` (as torchtitan orders it) on 2 gloo ranks of this CPU, 3 real
steps of 2 micro-batches each (``measure_fsdp_steps(..., loop=TrainingLoop(2))``).
Two loops, each collected and planned as it runs: FSDP2's default (the
gradients reduced after every micro-batch) and no-sync until the last
(``--fsdp-sync-last-micro-batch``: ``set_requires_gradient_sync(False)``
before micro-batch 1, each unit keeps its unsharded gradients until the
last micro-batch's reduction). Held to the default loop's stats, the
no-sync run's steady peak was over their prediction by 213,632 B (3.5%, the
unsharded gradients less their shards): the loop must be collected as it runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

import planner  # noqa: E402
from bench._machine import describe_machine  # noqa: E402
from bench.bench_planner import write_results  # noqa: E402

SECTION = "## FSDP2: gradient accumulation"
RANKS, BATCH, SEQ, MICRO_BATCHES, STEPS = 2, 4, 64, 2, 3
BUDGETS: tuple[float | str, ...] = ("min", 0.5, 0.75, 0.9)
CONFIG = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 64, "attention_dropout": 0.1}  # tests/estimators/est_helpers.py's TINY_LLAMA


def rank_main(rank: int, world_size: int, runs: list[tuple[str, Any, bool, Any]]) -> dict[str, list[int]]:
    """Every run on this rank: (label, plan or None, sync every micro-batch, its stats); the peak of each step."""
    from torch.distributed.device_mesh import init_device_mesh

    from estimators import TrainingLoop, apply_plan, build_from_hf_config, make_optimizer, measure_fsdp_steps, shard

    mesh = init_device_mesh("cpu", (world_size,))
    out = {}
    for label, plan, sync, stats in runs:
        torch.manual_seed(0)
        built = build_from_hf_config(CONFIG, batch_size=BATCH, seq_len=SEQ, dtype=torch.float32,
                                     device=torch.device("cpu"))
        if plan is not None:
            apply_plan(built.model, plan, stats=stats)
        shard(built.model, mesh, world_size=world_size)
        opt = make_optimizer("adamw", list(built.model.parameters()))
        steps = measure_fsdp_steps(built.model, built.inputs, built.loss_fn, opt, steps=STEPS, seed=1,
                                   loop=TrainingLoop(MICRO_BATCHES), sync_every_micro_batch=sync)
        out[label] = [m.peak_bytes for m in steps]
    return out


def plan_all(stats: Any) -> dict[str, Any]:
    """The plans at the smallest feasible budget and at each fraction of the baseline."""
    baseline = planner.baseline_peak_bytes(stats)
    plans = {}
    for budget in BUDGETS:
        gib = planner.min_feasible_budget_gib(stats) if budget == "min" else budget * baseline / planner.GIB
        plans[budget if isinstance(budget, str) else f"{budget:.0%}"] = planner.plan(stats, gib)
    return plans


def row(label: str, plan: Any, baseline: Any, peaks: list[list[int]]) -> str:
    """One run's line: the plan (or the baseline), both ranks' peaks, the steady state against the prediction."""
    predicted = plan.peak_bytes if plan is not None else baseline.baseline_peak_bytes
    budget = int(plan.memory_budget_gib * planner.GIB) if plan is not None else None
    ratio = max((x / predicted for r in peaks for x in r[1:]), key=lambda v: abs(v - 1))
    within = "" if budget is None else ("yes" if max(max(r) for r in peaks) <= budget else "no")
    return (f"| {label} | {plan.status if plan else 'baseline'} | {budget or ''} | {predicted} | "
            f"{(plan or baseline).peak_at} | {', '.join(map(str, peaks[0]))} | {', '.join(map(str, peaks[1]))} | "
            f"{ratio:.4f} | {within} |")


def main(argv: list[str] | None = None) -> int:
    from estimators import CollectRequest, run_collection, run_ranks

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write the section of bench/RESULTS.md")
    args = ap.parse_args(argv)
    machine = describe_machine("each rank on one thread")
    started = time.time()
    runs, expected, lines = [], {}, []
    for sync in (True, False):
        req = CollectRequest(hf_config=CONFIG, batch=BATCH, seq=SEQ, dtype="fp32", device="cpu", optimizer="adamw",
                             fsdp_world_size=RANKS, grad_accumulation=MICRO_BATCHES, sync_every_micro_batch=sync)
        stats = run_collection(req).stats
        loop = "reduce every micro-batch" if sync else "no-sync until the last"
        baseline = planner.plan(stats, 1024.0)
        runs.append((f"{loop}: none", None, sync, stats))
        expected[f"{loop}: none"] = (None, baseline)
        for label, plan in plan_all(stats).items():
            if plan.status in ("optimal", "feasible"):
                runs.append((f"{loop}: {label}", plan, sync, stats))
            expected[f"{loop}: {label}"] = (plan, baseline)
    ranks = run_ranks(rank_main, RANKS, runs)
    lines = ["| loop: plan | status | budget B | predicted B | peak at (predicted) | rank 0 real B, steps 1-3 | "
             "rank 1 real B, steps 1-3 | steady real/predicted | real <= budget |",
             "|---|---|---:|---:|---|---|---|---:|---|"]
    for label, (plan, baseline) in expected.items():
        if plan is not None and plan.status not in ("optimal", "feasible"):
            lines.append(f"| {label} | {plan.status} | {int(plan.memory_budget_gib * planner.GIB)} | | | | | | |")
        else:
            lines.append(row(label, plan, baseline, [r[label] for r in ranks]))
    text = (f"{SECTION}\n\n`python bench/bench_fsdp_accumulation.py` ({(time.time() - started) / 60:.1f} min). "
            f"Machine: {machine}\n\n" + __doc__.split("\n\n", 2)[2].replace("\n", " ").strip() + "\n\n"
            + "\n".join(lines) + "\n")
    print(text)
    if args.write:
        write_results(text, REPO / "bench" / "RESULTS.md", SECTION)
    return 0


if __name__ == "__main__":
    sys.exit(main())

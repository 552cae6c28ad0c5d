"""Plans at 82-97% of the per-rank baseline on a real 2-rank FSDP2 job, repeated: does any rank, any step, go over?

Issue 20's done-when (real per-rank peak <= budget at every step, within 2%
of the prediction) on the case where gloo's late release of collective
buffers showed (docs/fsdp.md, "On gloo"): the tiny llama of the tests (2
layers, hidden 64, batch 2, seq 32, fp32, AdamW), one rank's stats from the
fake process group, ``planner.plan`` at each budget, the plan applied before
``fully_shard`` (``bench/fsdp_run.py``), two measured steps per plan, the
whole set run ``--repeats`` times in fresh process groups. Prints a markdown
table for bench/RESULTS.md (section "FSDP2").

    nice python bench/bench_fsdp_sweep.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import planner  # noqa: E402
from bench._machine import describe_machine  # noqa: E402
from bench.fsdp_run import RunSpec, run_specs  # noqa: E402
from estimators import CollectRequest, run_collection, run_ranks  # noqa: E402

RANKS, BATCH, SEQ, STEPS = 2, 2, 32, 2
FRACTIONS = (0.82, 0.85, 0.88, 0.91, 0.94, 0.97)
CONFIG = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 64, "attention_dropout": 0.1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    req = CollectRequest(hf_config=CONFIG, batch=BATCH, seq=SEQ, dtype="fp32", device="cpu", optimizer="adamw",
                         fsdp_world_size=RANKS)
    stats = run_collection(req).stats
    baseline = planner.baseline_peak_bytes(stats)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "stats.json")
        path.write_text(json.dumps(stats.model_dump(mode="json")))
        specs, plans = [], []
        for f in FRACTIONS:
            budget = f * baseline
            p = planner.plan(stats, budget / planner.GIB)
            if p.status in ("optimal", "feasible") and p.modules:
                plans.append((f, budget, p))
                specs.append(RunSpec(f"p{round(f * 100)}", CONFIG, BATCH, SEQ, None, p.model_dump(mode="json"),
                                     str(path), STEPS))
        runs = [run_ranks(run_specs, RANKS, specs) for _ in range(args.repeats)]
    over, worst = 0, 0.0
    for i, (f, budget, p) in enumerate(plans):
        peaks = [[res[r][i].peaks for r in range(RANKS)] for res in runs]  # [repeat][rank][step]
        flat = [x for rep in peaks for rank in rep for x in rank[1:]]  # steady-state steps
        distinct = sorted({tuple(rank) for rep in peaks for rank in rep})
        over += sum(x > budget for rep in peaks for rank in rep for x in rank)
        worst = max(worst, max(abs(x / p.peak_bytes - 1) for x in flat))
        rows.append(f"| {f:.2f} | {len(p.modules)} | {budget:,.0f} | {p.peak_bytes:,} | "
                    f"{' ; '.join(' / '.join(f'{x:,}' for x in d) for d in distinct)} | "
                    f"{max(flat) - p.peak_bytes:+,} |")
    print(describe_machine(f"2 gloo ranks of 1 thread each, {args.repeats} repeats"))
    print()
    print("| fraction of baseline | modules | budget B | predicted B | real B by step (every distinct result over "
          "ranks and repeats) | worst steady real - predicted |")
    print("|---:|---:|---:|---:|---|---:|")
    print("\n".join(rows))
    print()
    print(f"rank-steps over the budget: {over} of {len(plans) * RANKS * STEPS * args.repeats}; "
          f"worst |real/predicted - 1| at steady state: {worst:.4%}")


if __name__ == "__main__":
    main()

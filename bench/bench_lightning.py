"""Lightning's Trainer as a client (issue 27 item 9): the recipe of docs/trainer.md ("Lightning") at every budget.

    pip install torch==2.13.0 lightning      # not a project dependency; torch held at the pinned version
    python bench/bench_lightning.py          # prints the table
    python bench/bench_lightning.py --write  # also writes its subsection of bench/RESULTS.md ("Training loops")

``bench/lightning_recipe.py``: the Trainer recipe's tiny Llama and padded batch inside a ``LightningModule``,
``lightning.Trainer(precision="bf16-mixed", accumulate_grad_batches=2, gradient_clip_val=1.0)``, torch's AdamW
from ``configure_optimizers``; collected from the LightningModule for those settings, planned at the smallest
feasible budget and 50/75/90% of the predicted no-checkpointing peak, applied, and ``fit()`` for 3 optimizer steps
on the CPU, one thread, measured by ``estimators.track_live_storages`` and a callback around each optimizer step.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench._machine import describe_machine  # noqa: E402
from bench.bench_trainer import table  # noqa: E402
from bench.bench_training_loops_model import write_section  # noqa: E402

SECTION = "### Training loops: Lightning"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the subsection of bench/RESULTS.md")
    args = parser.parse_args(argv)
    try:
        import lightning
    except ImportError:
        print("lightning is not installed: pip install torch==2.13.0 lightning (torch held at its version)")
        return 2
    from bench.lightning_recipe import run

    machine = describe_machine("one thread (torch.set_num_threads(1))")
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    rows = run()
    planned = [r for r in rows if r.status != "baseline" and r.peaks]
    held = sum(max(r.peaks) <= r.budget_bytes and all(abs(p / r.predicted_bytes - 1) <= 0.01 for p in r.peaks[1:])
               and bool(r.params_equal) for r in planned)
    text = (f"{SECTION}\n\n`python bench/bench_lightning.py` ({time.perf_counter() - t0:.0f} s; lightning "
            f"{lightning.__version__}, torch {torch.__version__}). Machine: {machine}\n\n"
            f"{held} of {len(planned)} plans hold under `lightning.Trainer(...).fit()` (real peak <= budget at every "
            f"step, steady state within 1% of the prediction, parameters torch.equal to Lightning's unplanned run). "
            f"No reserve: Lightning's loop held nothing at the peaks beyond the collected step.\n\n{table(rows)}\n")
    print(text)
    if args.write:
        write_section(text, SECTION)
    return 0 if held == len(planned) else 1


if __name__ == "__main__":
    sys.exit(main())

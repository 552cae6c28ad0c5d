"""Plans in the training loops people run (issue 27): each loop collected, planned, applied and held to real steps.

    python bench/bench_training_loops.py            # every case; rewrites the "## Training loops" section
    python bench/bench_training_loops.py --only accum --no-write

A case is a model and a training loop (micro-batches, autocast, a GradScaler,
clipping, the optimizer). For each: collect its stats under fake tensors
(``estimators.collect_stats`` with the loop), plan at 50%, 75% and 90% of the
predicted no-checkpointing peak and at the smallest feasible budget, apply
each plan to a copy of the model and run ``STEPS`` real optimizer steps of
the same loop (``estimators.measure_steps(..., loop=...)``; peak = every
distinct live storage, exact whatever else runs on the machine), beside the
same steps unplanned. Checked per plan: the real peak is at most the budget
at every step, the steady-state peak (steps 2 on: the optimizer state
exists) within 1% of the plan's prediction, and after the steps every
parameter, buffer and the gradients of one more forward and backward are
``torch.equal`` to the unplanned run's.

Cases are a list (``CASES``): other loops (tokenizer masks, wrapped models,
BatchNorm, the HF Trainer) are one more ``Case`` with their own factory.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

import planner  # noqa: E402
from estimators import (RooflineCostModel, apply_plan, build_from_hf_config, call_model, collect_stats,  # noqa: E402
                        default_loss, device_spec, make_optimizer, measure_steps)
from estimators.common import TrainingLoop  # noqa: E402

SECTION = "## Training loops"
FRACTIONS: list[float | str] = [0.5, 0.75, 0.9, "min"]
STEPS = 3
SEQ = 128  # per micro-batch: long enough that 50% of the peak has a plan
TOLERANCE = 0.01
MIB = 2**20
# The tests' tiny Llama (tests/estimators/est_helpers.py) at 4 layers, batch 4 x SEQ: activations outweigh the
# AdamW state.
TINY_LLAMA = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
              "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 64, "attention_dropout": 0.1, "num_hidden_layers": 4}


def tiny_llama() -> tuple[torch.nn.Module, Any, Callable | None]:
    """(model, one micro-batch, loss_fn): the tiny HF Llama on the CPU, fp32, seeded."""
    torch.manual_seed(0)
    built = build_from_hf_config(TINY_LLAMA, batch_size=4, seq_len=SEQ, dtype=torch.float32,
                                 device=torch.device("cpu"))
    return built.model, built.inputs, None


@dataclass(frozen=True)
class Case:
    """One row group of the matrix: a model and the loop it trains in."""

    name: str
    loop: TrainingLoop = TrainingLoop()
    optimizer: str = "adamw"
    optimizer_kwargs: dict[str, Any] | None = None
    factory: Callable[[], tuple[torch.nn.Module, Any, Callable | None]] = tiny_llama


CASES = [
    Case("grad accumulation 1"),
    Case("grad accumulation 2", TrainingLoop(grad_accumulation=2)),
    Case("grad accumulation 4", TrainingLoop(grad_accumulation=4)),
    Case("autocast bf16, clip 1.0", TrainingLoop(autocast="bf16", max_grad_norm=1.0)),
    Case("autocast fp16 + GradScaler, clip 1.0", TrainingLoop(autocast="fp16", grad_scaler=True, max_grad_norm=1.0)),
    Case("SGD (no momentum)", optimizer="sgd"),
    Case("Adagrad", optimizer="torch.optim.Adagrad"),
    Case("Adafactor", optimizer="transformers.optimization.Adafactor"),
    Case("Adam amsgrad=True", optimizer="adam", optimizer_kwargs={"amsgrad": True}),
]


@dataclass
class Row:
    """One plan of one case against its real steps."""

    case: str
    budget: str
    status: str
    budget_bytes: int | None = None
    predicted_bytes: int | None = None
    peaks: list[int] = field(default_factory=list)
    peak_at: str | None = None
    real_peak_micro_batch: int | None = None
    recompute_ms: float | None = None
    recompute_ms_per_step: float | None = None
    state_equal: bool | None = None

    @property
    def within_budget(self) -> bool:
        return all(p <= self.budget_bytes for p in self.peaks)

    @property
    def steady_ratio(self) -> float:
        """The steady-state step (2 on) furthest from the prediction, as real / predicted."""
        return max((p / self.predicted_bytes for p in self.peaks[1:]), key=lambda r: abs(r - 1))

    @property
    def holds(self) -> bool:
        return self.within_budget and abs(self.steady_ratio - 1) <= TOLERANCE and bool(self.state_equal)


def collect(case: Case, model: torch.nn.Module, inputs: Any, loss_fn: Callable | None) -> planner.Stats:
    """The case's stats: its loop collected under fake tensors, costed for this CPU."""
    loop = case.loop
    return collect_stats(model, inputs, loss_fn=loss_fn, optimizer=case.optimizer,
                         optimizer_kwargs=case.optimizer_kwargs, grad_accumulation=loop.grad_accumulation,
                         autocast=loop.autocast, grad_scaler=loop.grad_scaler, max_grad_norm=loop.max_grad_norm,
                         device="cpu", cost_model=RooflineCostModel(device_spec("cpu")))


def train(case: Case, model: torch.nn.Module, inputs: Any, loss_fn: Callable | None) -> tuple[list, dict]:
    """``STEPS`` real steps of the case's loop; the measures and the state after them (parameters, buffers,
    and the gradients of one more forward and backward)."""
    opt = make_optimizer(case.optimizer, list(model.parameters()), kwargs=case.optimizer_kwargs)
    steps = measure_steps(model, inputs, loss_fn, opt, steps=STEPS, loop=case.loop)
    torch.manual_seed(STEPS)
    device_type = next(model.parameters()).device.type
    with case.loop.autocast_context(device_type):
        loss = (loss_fn or default_loss)(call_model(model, inputs))
    loss.backward()
    state = {f"param {n}": p.detach().clone() for n, p in model.named_parameters()}
    state |= {f"grad {n}": p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    state |= {f"buffer {n}": b.clone() for n, b in model.named_buffers()}
    model.zero_grad(set_to_none=True)
    return steps, state


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def run_case(case: Case, fractions: list[float | str] = FRACTIONS) -> list[Row]:
    """Every budget of one case: a row per plan, and one for the step without a plan."""
    model, inputs, loss_fn = case.factory()
    stats = collect(case, model, inputs, loss_fn)
    baseline = planner.baseline_peak_bytes(stats)
    base_steps, base_state = train(case, copy.deepcopy(model), inputs, loss_fn)
    rows = [Row(case.name, "none", "baseline", baseline, baseline, [s.peak_bytes for s in base_steps],
                planner.plan(stats, baseline / planner.GIB).peak_at, base_steps[-1].peak_micro_batch,
                state_equal=True)]
    for fraction in fractions:
        if fraction == "min":
            budget = planner.plan(stats, 1e-6).min_feasible_budget_gib
            label = "smallest"
        else:
            budget, label = fraction * baseline / planner.GIB, f"{fraction:.0%}"
        plan = planner.plan(stats, budget)
        row = Row(case.name, label, plan.status, int(budget * planner.GIB), plan.peak_bytes, peak_at=plan.peak_at,
                  recompute_ms=plan.recompute_ms, recompute_ms_per_step=plan.recompute_ms_per_optimizer_step)
        if plan.status in ("optimal", "feasible"):
            planned = copy.deepcopy(model)
            apply_plan(planned, plan, stats=stats)
            steps, state = train(case, planned, inputs, loss_fn)
            row.peaks = [s.peak_bytes for s in steps]
            row.real_peak_micro_batch = steps[-1].peak_micro_batch
            row.state_equal = _equal(state, base_state)
        rows.append(row)
    return rows


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / MIB:.3f}"


def table(rows: list[Row]) -> list[str]:
    out = ["| case | budget | MiB | status | predicted MiB | real peak MiB, steps 1-3 | real/predicted (steady) "
           "| <= budget | state equal | peak at (predicted) | real peak's micro-batch | recompute ms (per optimizer "
           "step) |",
           "|---|---|---:|---|---:|---|---:|---|---|---|---:|---:|"]
    for r in rows:
        ok = r.peaks and r.budget_bytes is not None
        rc = "-" if r.recompute_ms is None else f"{r.recompute_ms:.3f}"
        if r.recompute_ms_per_step is not None:
            rc += f" ({r.recompute_ms_per_step:.3f})"
        out.append(f"| {r.case} | {r.budget} | {_mib(r.budget_bytes)} | {r.status} | {_mib(r.predicted_bytes)} | "
                   f"{', '.join(_mib(p) for p in r.peaks) or '-'} | "
                   f"{f'{r.steady_ratio:.4f}' if ok else '-'} | {('yes' if r.within_budget else '**no**') if ok else '-'} | "
                   f"{'-' if r.state_equal is None else 'yes' if r.state_equal else '**no**'} | {r.peak_at or '-'} | "
                   f"{r.real_peak_micro_batch or '-'} | {rc} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", metavar="TEXT", help="run only the cases whose name contains TEXT")
    ap.add_argument("--no-write", action="store_true", help="print the table; leave bench/RESULTS.md alone")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from bench._machine import describe_machine
    from bench.bench_planner import write_results

    machine = describe_machine("runs on 1 thread")
    cases = [c for c in CASES if not args.only or any(t in c.name for t in args.only)]
    t0, rows = time.perf_counter(), []
    for case in cases:
        rows += run_case(case)
        print("\n".join(table(rows)[-(len(FRACTIONS) + 1):]), flush=True)
    planned = [r for r in rows if r.budget != "none" and r.peaks]
    held = sum(r.holds for r in planned)
    text = [SECTION, "", f"Machine: {machine}", "",
            f"Command: `python bench/bench_training_loops.py` ({(time.perf_counter() - t0) / 60:.1f} min). "
            f"The tests' tiny HF Llama at 4 layers (hidden 64, batch 4 x {SEQ} per micro-batch, fp32 weights, SDPA, "
            f"dropout 0.1), CPU, {STEPS} real optimizer steps per plan beside the same steps unplanned. Plans "
            f"at 50/75/90% of the predicted no-checkpointing peak and at the smallest feasible budget. "
            f"Held (real peak <= budget at every step, steady state within 1% of predicted, parameters, buffers "
            f"and gradients torch.equal to the unplanned run): **{held} of {len(planned)} plans**. Two more runners "
            f"follow, one table each: masks, wrappers and BatchNorm (`bench/bench_training_loops_model.py`), the "
            f"Hugging Face Trainer (`bench/bench_trainer.py`); run with `--write` after this one.", "",
            *table(rows)]
    print("\n".join(text))
    if not args.no_write:
        write_results("\n".join(text) + "\n", REPO / "bench" / "RESULTS.md", SECTION)
    return 0 if held == len(planned) else 1


if __name__ == "__main__":
    raise SystemExit(main())

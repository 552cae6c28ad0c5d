"""Lightning's ``Trainer`` as a client (issue 27 item 9, "if Lightning also works"): collect, apply, ``fit()``.

The same tiny Llama and padded batch as :mod:`bench.trainer_recipe`, inside a ``LightningModule`` (a wrapper
whose ``training_step`` returns the Hugging Face model's own loss), trained by ``lightning.Trainer`` with
``precision="bf16-mixed"``, ``accumulate_grad_batches=2`` and ``gradient_clip_val=1.0`` on the CPU. The
Trainer's settings are turned into the collector's (:func:`collect_options`), the stats collected from the
LightningModule itself, the plan applied to it, and ``fit()`` run under :func:`estimators.track_live_storages`
with a callback that takes the peak of every optimizer step (all its micro-batches, clipping, the step, zeroing).

``lightning`` is not a project dependency: install it beside the pinned torch
(``pip install torch==2.13.0 lightning``) to run this.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

import planner
from bench.trainer_recipe import BATCH, build, rows_of
from estimators import RooflineCostModel, apply_plan, collect_stats, device_spec, track_live_storages

ACCUMULATE = 2
LR = 1e-4
# What a fine-tuning script sets; everything else is Lightning's default.
TRAINER_SETTINGS = {"precision": "bf16-mixed", "accumulate_grad_batches": ACCUMULATE, "gradient_clip_val": 1.0}
# Ours: the CPU, no files, no logger, no progress bar.
QUIET = {"accelerator": "cpu", "devices": 1, "logger": False, "enable_checkpointing": False,
         "enable_progress_bar": False, "enable_model_summary": False, "num_sanity_val_steps": 0}


def lightning_module(model: torch.nn.Module) -> Any:
    """A ``LightningModule`` around a Hugging Face causal LM: forward is the model's, the loss its own, AdamW."""
    import lightning

    class CausalLM(lightning.LightningModule):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.model = inner

        def forward(self, input_ids, attention_mask=None, labels=None):
            return self.model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)

        def training_step(self, batch, batch_idx):
            return self(**batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=LR)

    return CausalLM(model)


def collect_options() -> dict[str, Any]:
    """``collect_stats`` keywords for the step Lightning runs with :data:`TRAINER_SETTINGS`: ``"bf16-mixed"`` is
    autocast bf16 over fp32 weights around ``training_step``; ``gradient_clip_val`` clips the norm (Lightning's
    default algorithm); the optimizer is the module's ``configure_optimizers`` (torch's AdamW, foreach on the CPU
    as torch picks it)."""
    return {"autocast": "bf16", "grad_accumulation": ACCUMULATE, "max_grad_norm": TRAINER_SETTINGS["gradient_clip_val"],
            "optimizer": "torch.optim.AdamW", "optimizer_kwargs": {"lr": LR}}


def step_peaks_callback(tracker: Any) -> Any:
    """A Lightning ``Callback`` recording the live-memory peak of every optimizer step in ``callback.peaks``."""
    import lightning

    class StepPeaks(lightning.Callback):
        def __init__(self) -> None:
            self.peaks: list[int] = []

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if batch_idx % ACCUMULATE == 0:
                tracker.restart_peak()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if batch_idx % ACCUMULATE == ACCUMULATE - 1:
                self.peaks.append(tracker.peak_bytes)

    return StepPeaks()


def fit(module: torch.nn.Module, batch: dict[str, torch.Tensor], steps: int) -> tuple[list[int], dict]:
    """``lightning.Trainer(...).fit()`` for ``steps`` optimizer steps, measured: the peaks per step, the parameters."""
    import lightning

    loader = torch.utils.data.DataLoader(rows_of(batch, steps * ACCUMULATE), batch_size=BATCH, shuffle=False)
    with track_live_storages(module) as tracker:
        callback = step_peaks_callback(tracker)
        trainer = lightning.Trainer(max_steps=steps, callbacks=[callback], **TRAINER_SETTINGS, **QUIET)
        trainer.fit(module, loader)
    return callback.peaks, {n: p.detach().clone() for n, p in module.named_parameters()}


@dataclass
class LightningRun:
    """One plan under Lightning: the budget, the plan's peak, the real peak of each optimizer step."""

    budget: str
    status: str
    budget_bytes: int
    predicted_bytes: int | None = None
    peaks: tuple[int, ...] = ()
    params_equal: bool | None = None


def run(budgets: tuple[float | str, ...] = ("min", 0.5, 0.75, 0.9), steps: int = 3) -> list[LightningRun]:
    """The recipe at each budget (a fraction of the predicted no-checkpointing peak, or ``"min"``), beside Lightning
    unplanned; the first row is the unplanned run against the stats' baseline.

    No reserve: unlike the Hugging Face Trainer, Lightning's loop held nothing at the step's peak beyond what the
    stats describe (measured: every planned peak within 4 B of its prediction without one)."""
    model, batch = build()
    module = lightning_module(model)
    options = planner.PlanOptions()
    stats = collect_stats(module, batch, device="cpu", cost_model=RooflineCostModel(device_spec("cpu")),
                          **collect_options())
    baseline = planner.plan(stats, 1e3, options=options).baseline_peak_bytes
    torch.manual_seed(0)
    unplanned = copy.deepcopy(module)
    unplanned.model.config.use_cache = False  # as apply_plan runs a model: no KV cache in a training step
    base_peaks, base_params = fit(unplanned, batch, steps)
    rows = [LightningRun("none", "baseline", baseline, baseline, tuple(base_peaks), True)]
    for budget in budgets:
        gib = (planner.plan(stats, 1e-6, options=options).min_feasible_budget_gib if budget == "min"
               else float(budget) * baseline / planner.GIB)
        plan = planner.plan(stats, gib, options=options)
        row = LightningRun(budget if isinstance(budget, str) else f"{budget:.0%}", plan.status,
                           int(plan.memory_budget_gib * planner.GIB))
        if plan.status in ("optimal", "feasible"):
            planned = copy.deepcopy(module)
            apply_plan(planned, plan, stats=stats, example_inputs=batch)
            torch.manual_seed(0)
            peaks, params = fit(planned, batch, steps)
            row.predicted_bytes, row.peaks = plan.peak_bytes, tuple(peaks)
            row.params_equal = all(torch.equal(params[n], base_params[n]) for n in base_params)
        rows.append(row)
    return rows

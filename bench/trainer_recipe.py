"""The Hugging Face Trainer as a client (issue 27 item 9): collect for its settings, apply the plan, ``train()``.

The recipe of ``docs/trainer.md``, run on a tiny Llama built from a config
(CPU, random weights, nothing downloaded): the Trainer's own settings are
turned into the collector's (:func:`collect_options`: ``bf16=True`` is
autocast bf16 over fp32 weights, ``gradient_accumulation_steps`` the
micro-batches, ``max_grad_norm`` the clipping, the optimizer class and
arguments the Trainer itself builds), the stats collected from one batch as
the Trainer's collator makes it, a plan applied to the model, and
``Trainer(...).train()`` run under :func:`estimators.track_live_storages`
with a callback that takes the peak of every optimizer step.
"""

from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass
from typing import Any

import torch

import planner
from estimators import RooflineCostModel, apply_plan, collect_stats, device_spec, track_live_storages
from estimators.collect import attention_mask_batch

BATCH, SEQ = 4, 128
TINY_LLAMA = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": SEQ, "attention_dropout": 0.1}
# What a fine-tuning script sets; everything else is the Trainer's default (AdamW fused, lr 5e-5, clip 1.0).
TRAINER_SETTINGS = {"bf16": True, "gradient_accumulation_steps": 2, "per_device_train_batch_size": BATCH,
                    "weight_decay": 0.01}
# Ours: the CPU, no files, no shuffling (every micro-batch is the batch collected), no progress bars.
QUIET = {"use_cpu": True, "report_to": "none", "save_strategy": "no", "logging_strategy": "no",
         "disable_tqdm": True, "train_sampling_strategy": "sequential", "dataloader_num_workers": 0, "seed": 0}


def training_args(output_dir: str, steps: int) -> Any:
    """The Trainer's arguments: the script's settings, ``steps`` optimizer steps, quiet."""
    import transformers

    return transformers.TrainingArguments(output_dir=output_dir, max_steps=steps, **TRAINER_SETTINGS, **QUIET)


def collect_options(args: Any) -> dict[str, Any]:
    """``collect_stats`` keywords for the step a Trainer with these arguments runs (the same as ``sacplan collect``
    options: ``--autocast``, ``--grad-accumulation``, ``--max-grad-norm``, ``--optimizer``, ``--optimizer-kwargs``).

    The optimizer is what ``Trainer.create_optimizer`` builds: the class and arguments of
    ``Trainer.get_optimizer_cls_and_kwargs`` (torch's AdamW with ``fused=True`` by default on torch 2.8 on, the CPU
    too) and the weight decay it sets per parameter group."""
    import transformers

    if args.fp16:
        raise ValueError("fp16=True: collect with autocast='fp16', grad_scaler=True (not in this recipe)")
    cls, kwargs = transformers.Trainer.get_optimizer_cls_and_kwargs(args)
    return {"autocast": "bf16" if args.bf16 else None, "grad_accumulation": args.gradient_accumulation_steps,
            "max_grad_norm": args.max_grad_norm or None, "optimizer": f"{cls.__module__}.{cls.__qualname__}",
            "optimizer_kwargs": {**kwargs, "weight_decay": args.weight_decay}}


def trainer_reserve_bytes(args: Any, batch: dict[str, torch.Tensor]) -> int:
    """What the Trainer holds beyond the step the stats describe (which holds one micro-batch's tensors): every
    micro-batch of the optimizer step, fetched before the first forward, and the next one, which accelerate's data
    loader fetches ahead; plus 1 KiB for the Trainer's scalars (the summed loss, the gradient norm: 20 B measured).
    Plan with it as ``PlanOptions(reserve_gib=...)`` (``sacplan plan --reserve-gib``)."""
    batch_bytes = sum(t.untyped_storage().nbytes() for t in batch.values() if isinstance(t, torch.Tensor))
    return args.gradient_accumulation_steps * batch_bytes + 1024


def build() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The tiny Llama (fp32, SDPA, seeded) and one padded batch: rows of 128, 96, 64 and 43 tokens."""
    import transformers

    torch.manual_seed(0)
    doc = dict(TINY_LLAMA)
    config = transformers.AutoConfig.for_model(doc.pop("model_type"), attn_implementation="sdpa", **doc)
    model = transformers.LlamaForCausalLM(config).train()
    ids = torch.randint(2, TINY_LLAMA["vocab_size"], (BATCH, SEQ))
    batch = attention_mask_batch(ids, "padded", 0.25, 0)
    lengths = torch.tensor([SEQ, SEQ * 3 // 4, SEQ // 2, SEQ // 3])
    batch["attention_mask"] = (torch.arange(SEQ) < lengths[:, None]).long()
    batch["input_ids"] = ids.masked_fill(batch["attention_mask"] == 0, 0)
    batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    return model, batch


def rows_of(batch: dict[str, torch.Tensor], repeats: int) -> list[dict[str, torch.Tensor]]:
    """A dataset whose every ``BATCH`` consecutive rows are ``batch`` again (the default collator stacks them)."""
    return [{k: v[i].clone() for k, v in batch.items()} for _ in range(repeats) for i in range(BATCH)]


def step_peaks_callback(tracker: Any) -> Any:
    """A ``TrainerCallback`` that records the live-memory peak of every optimizer step (all its micro-batches,
    clipping, the optimizer step, ``zero_grad``) in ``callback.peaks``."""
    import transformers

    class StepPeaks(transformers.TrainerCallback):
        def __init__(self) -> None:
            self.peaks: list[int] = []

        def on_step_begin(self, args, state, control, **kwargs):
            tracker.restart_peak()

        def on_step_end(self, args, state, control, **kwargs):
            self.peaks.append(tracker.peak_bytes)

    return StepPeaks()


def train(model: torch.nn.Module, batch: dict[str, torch.Tensor], steps: int) -> tuple[list[int], dict]:
    """``Trainer(...).train()`` for ``steps`` optimizer steps, measured: the peaks per step, the parameters after."""
    import transformers

    with tempfile.TemporaryDirectory() as out:
        args = training_args(out, steps)
        dataset = rows_of(batch, steps * args.gradient_accumulation_steps)
        with track_live_storages(model) as tracker:
            callback = step_peaks_callback(tracker)
            trainer = transformers.Trainer(model=model, args=args, train_dataset=dataset, callbacks=[callback])
            trainer.train()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return callback.peaks, params


@dataclass
class TrainerRun:
    """One plan under the Trainer: the budget, the plan's peak, the real peak of each optimizer step."""

    budget: str
    status: str
    budget_bytes: int
    predicted_bytes: int | None = None
    peaks: tuple[int, ...] = ()
    params_equal: bool | None = None


def run(budgets: tuple[float | str, ...] = ("min", 0.5, 0.75, 0.9), steps: int = 3) -> list[TrainerRun]:
    """The recipe at each budget (a fraction of the predicted no-checkpointing peak, or ``"min"``), beside the
    Trainer unplanned; the first row is the unplanned run against the stats' baseline."""
    model, batch = build()
    with tempfile.TemporaryDirectory() as out:
        args = training_args(out, steps)
    options = planner.PlanOptions(reserve_gib=trainer_reserve_bytes(args, batch) / planner.GIB)
    stats = collect_stats(model, batch, device="cpu", cost_model=RooflineCostModel(device_spec("cpu")), **collect_options(args))
    baseline = planner.plan(stats, 1e3, options=options).baseline_peak_bytes
    unplanned = copy.deepcopy(model)
    unplanned.config.use_cache = False  # as apply_plan runs a model: no KV cache in a training step
    base_peaks, base_params = train(unplanned, batch, steps)
    rows = [TrainerRun("none", "baseline", baseline, baseline, tuple(base_peaks), True)]
    for budget in budgets:
        gib = (planner.plan(stats, 1e-6, options=options).min_feasible_budget_gib if budget == "min"
               else float(budget) * baseline / planner.GIB)
        plan = planner.plan(stats, gib, options=options)
        row = TrainerRun(budget if isinstance(budget, str) else f"{budget:.0%}", plan.status,
                         int(plan.memory_budget_gib * planner.GIB))
        if plan.status in ("optimal", "feasible"):
            planned = copy.deepcopy(model)
            apply_plan(planned, plan, stats=stats, example_inputs=batch)
            peaks, params = train(planned, batch, steps)
            row.predicted_bytes, row.peaks = plan.peak_bytes, tuple(peaks)
            row.params_equal = all(torch.equal(params[n], base_params[n]) for n in base_params)
        rows.append(row)
    return rows

"""The Hugging Face Trainer as a client (issue 27 item 9): the recipe of docs/trainer.md, held to its real steps.

A tiny Llama from a config, tokenizer-style padded rows (128, 96, 64 and 43 tokens of 128), the Trainer's
``bf16=True``, ``gradient_accumulation_steps=2``, its default clipping (1.0) and optimizer (torch's AdamW, fused);
the step collected for those settings, planned with the Trainer's reserve (``trainer_reserve_bytes``: the
micro-batches it fetches ahead), applied, and ``Trainer(...).train()`` run on the CPU for 3 optimizer steps under
``estimators.track_live_storages``. Before the reserve, every plan's real peak was above its prediction by exactly
two micro-batches' tensors plus 20 B (24,596 B: ``bench/RESULTS.md``, "Training loops").
"""

from __future__ import annotations

import tempfile

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer's own requirement

from bench import trainer_recipe  # noqa: E402


def test_collect_options_are_the_trainers():
    with tempfile.TemporaryDirectory() as out:
        args = trainer_recipe.training_args(out, 3)
    options = trainer_recipe.collect_options(args)
    # transformers' defaults (TrainingArguments): optim adamw_torch_fused on torch >= 2.8, lr 5e-5, betas
    # (0.9, 0.999), eps 1e-8, max_grad_norm 1.0
    assert options == {"autocast": "bf16", "grad_accumulation": 2, "max_grad_norm": 1.0,
                       "optimizer": "torch.optim.adamw.AdamW",
                       "optimizer_kwargs": {"lr": 5e-5, "betas": (0.9, 0.999), "eps": 1e-8, "fused": True,
                                            "weight_decay": 0.01}}


def test_plan_holds_under_the_trainer():
    torch.set_num_threads(1)
    base, run = trainer_recipe.run(budgets=(0.75,), steps=3)
    assert base.params_equal and run.status == "optimal"
    steady = run.peaks[1:]  # step 1 has no optimizer state yet
    assert max(run.peaks) <= run.budget_bytes, (run.peaks, run.budget_bytes)
    assert all(abs(p / run.predicted_bytes - 1) <= 0.01 for p in steady), (steady, run.predicted_bytes)
    assert run.params_equal  # the plan changes no parameter of the Trainer's run

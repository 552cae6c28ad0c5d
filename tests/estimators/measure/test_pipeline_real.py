"""A real 2-stage 1F1B pipeline (torch.distributed.pipelining on gloo, 2 spawned ranks on 127.0.0.1) against the
per-stage plans: each stage's steady-state peak as predicted, never over the budget, and the same losses and
gradients as the whole model trained on the same microbatches in one process (issue 30)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import planner  # noqa: E402
from estimators.cli.pipeline_verify import run_pipeline  # noqa: E402
from estimators.collect import CollectRequest, pipeline_loss, run_pipeline_collection  # noqa: E402
from estimators.common import PipelineSetup  # noqa: E402

CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64,
          "tie_word_embeddings": False}
BATCH, SEQ, M, STEPS = 2, 64, 4, 2


def _reference(setup: PipelineSetup) -> tuple[list[float], dict[str, tuple[float, float]]]:
    """The whole model, one process: step 2's per-microbatch losses and its gradients (the schedule's: the
    microbatches' sum over M), after one AdamW step, as pipeline_rank builds the model and batch."""
    from transformers import AutoConfig, AutoModelForCausalLM

    doc = dict(CONFIG)
    cfg = AutoConfig.for_model(doc.pop("model_type"), **doc)
    cfg.use_cache = False
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    model.train()
    ids = torch.randint(0, cfg.vocab_size, (BATCH * M, SEQ), generator=torch.Generator().manual_seed(1))
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    for _ in range(STEPS):
        losses = []
        for mb in ids.split(BATCH):
            loss = pipeline_loss(model(input_ids=mb).logits, mb)
            (loss / M).backward()
            losses.append(float(loss.detach()))
        grads = {n: (float(p.grad.sum()), float(p.grad.norm())) for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses, grads


def test_a_real_1f1b_pipeline_runs_each_stage_at_its_predicted_peak(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    setup = PipelineSetup(2, "1f1b", M)
    stats = [r.stats for r in run_pipeline_collection(
        CollectRequest(hf_config=str(path), batch=BATCH, seq=SEQ, pp_stages=2, microbatches=M))]
    budget_gib = 0.85 * planner.baseline_peak_bytes(stats[0]) / planner.GIB
    pp = planner.plan_pipeline(stats, budget_gib)
    assert pp.status == "optimal" and pp.stages[0].modules  # the first stage (2 in flight) must checkpoint
    real = run_pipeline(CONFIG, setup, batch=BATCH, seq=SEQ, steps=STEPS, plans=pp.stages, stats=stats)
    for stage, (plan, rank) in enumerate(zip(pp.stages, real)):
        peak = rank["peaks"][-1]  # step 2: AdamW's state live, the steady state the plans are for
        assert peak == pytest.approx(plan.peak_bytes, rel=0.01), stage
        assert max(rank["peaks"]) <= budget_gib * planner.GIB, stage
    losses, grads = _reference(setup)
    assert real[1]["losses"] == pytest.approx(losses, rel=1e-5)
    stage_grads = {**real[0]["grads"], **real[1]["grads"]}
    assert stage_grads.keys() == grads.keys()
    for name, (total, norm) in grads.items():
        assert stage_grads[name][1] == pytest.approx(norm, rel=1e-4, abs=1e-7), name
        assert stage_grads[name][0] == pytest.approx(total, rel=1e-3, abs=1e-5 * max(norm, 1e-3)), name

"""Hugging Face MoE models as users build them: collect under fake tensors, apply a plan, replay the routing.

The tiny configs (2 layers, 4 experts, top-2, hidden 64) are built with
``AutoModelForCausalLM.from_config`` and no other setting, so the experts run
Hugging Face's default implementation (``grouped_mm``), or ``eager`` where
the test asks for it. Expected sizes come from the routing the collector
assumes (``estimators.collect.moe``) and Hugging Face's experts code
(``transformers.integrations.moe.grouped_mm_experts_forward``: the up
projection gets one row per token and choice, tokens x top-k).
"""

from __future__ import annotations

import copy
import math
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import planner  # noqa: E402
from estimators import RooflineCostModel, apply_plan, build_from_hf_config, collect_stats, device_spec  # noqa: E402
from estimators import MoeRouting  # noqa: E402
from estimators.collect import TopKRecorder, parse_moe_routing  # noqa: E402
from estimators.apply.settings_match import experts_mismatch  # noqa: E402
from planner import optimal_op_policy  # noqa: E402
from planner.cli import main  # noqa: E402
from est_helpers import TINY_MIXTRAL  # noqa: E402

EXPERTS, TOP_K = TINY_MIXTRAL["num_local_experts"], TINY_MIXTRAL["num_experts_per_tok"]
INTERMEDIATE = TINY_MIXTRAL["intermediate_size"]
TINY_QWEN2_MOE = {**{k: v for k, v in TINY_MIXTRAL.items() if k != "num_local_experts"}, "model_type": "qwen2_moe",
                  "num_experts": EXPERTS, "moe_intermediate_size": INTERMEDIATE, "shared_expert_intermediate_size": 128}
BATCH, SEQ = 2, 32
TOKENS = BATCH * SEQ
EXPERTS_FQN = "MixtralForCausalLM.model.layers.0.mlp.experts"


def _build(config: dict, device: str = "cpu", dtype=torch.float32, batch: int = BATCH, seq: int = SEQ):
    torch.manual_seed(0)
    return build_from_hf_config(config, batch_size=batch, seq_len=seq, dtype=dtype, device=torch.device(device))


def _collect(built, routing: MoeRouting | None = None, dtype=None):
    return collect_stats(built.model, built.inputs, optimizer="adamw", device="cpu", dtype=dtype,
                         cost_model=RooflineCostModel(device_spec("cpu")), moe_routing=routing)


@pytest.mark.parametrize("config", [TINY_MIXTRAL, TINY_QWEN2_MOE], ids=["mixtral", "qwen2_moe"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_default_experts_collect_in_fp32_and_bf16(config, dtype):
    stats = _collect(_build(config, "meta", dtype), dtype=dtype)
    assert stats.metadata.model_settings.items() >= {"experts_implementation": "grouped_mm",
                                                     "moe_routing": "balanced"}.items()
    experts = next(m for m in stats.modules if m.fqn.endswith("layers.0.mlp.experts"))
    grouped = [op for op in experts.ops if op.name == "aten._grouped_mm"]
    assert len(grouped) == 2  # up (gate and up together) and down projections
    # one row per token and choice: (tokens x top-k, 2 x intermediate) for the gated up projection
    assert grouped[0].output_bytes == TOKENS * TOP_K * 2 * INTERMEDIATE * dtype.itemsize


# Other Hugging Face MoE families, small, from AutoConfig.for_model's defaults otherwise.
OTHER_MOE = {
    "olmoe": {"num_experts": EXPERTS, "eos_token_id": 1, "pad_token_id": 0},
    "granitemoe": {"num_local_experts": EXPERTS},
    "qwen3_moe": {"num_experts": EXPERTS, "moe_intermediate_size": INTERMEDIATE, "head_dim": 16},
}


@pytest.mark.parametrize("model_type", list(OTHER_MOE))
def test_other_moe_families_collect_with_default_experts(model_type):
    base = {k: v for k, v in TINY_MIXTRAL.items() if k != "num_local_experts"}
    stats = _collect(_build({**base, **OTHER_MOE[model_type], "model_type": model_type}, "meta"))
    assert stats.metadata.model_settings.items() >= {"experts_implementation": "grouped_mm",
                                                     "moe_routing": "balanced"}.items()
    assert sum(op.name == "aten._grouped_mm" for m in stats.modules for op in (m.ops or [])) > 0


def _rows(stats, fqn: str) -> list[int]:
    """Rows each expert's up projection got (the eager experts' aten.mm outputs, every other one)."""
    mms = [op.output_bytes for op in stats.module(fqn).ops if op.name == "aten.mm"]
    return [b // (2 * INTERMEDIATE * 4) for b in mms[::2]]


@pytest.mark.parametrize("routing, first", [
    (MoeRouting(), TOKENS * TOP_K // EXPERTS),  # balanced: every expert its share
    (MoeRouting("capacity", 1.5), math.ceil(1.5 * TOKENS * TOP_K / EXPERTS)),
    (MoeRouting("worst"), TOKENS),  # one expert gets every token
])
def test_eager_experts_get_the_assumed_token_counts(routing, first):
    stats = _collect(_build({**TINY_MIXTRAL, "experts_implementation": "eager"}, "meta"), routing)
    rows = _rows(stats, EXPERTS_FQN)
    assert len(rows) == EXPERTS and rows[0] == first and sum(rows) == TOKENS * TOP_K
    assert max(rows[1:]) - min(rows[1:]) <= 1  # the others share the rest evenly
    assert stats.metadata.model_settings.items() >= {"experts_implementation": "eager", **routing.settings()}.items()


@pytest.mark.parametrize("kind, factor", [("balanced", None), ("capacity", 1.25), ("capacity", 3.0), ("worst", None)])
def test_routing_indices_are_distinct_per_token_with_the_stated_load(kind, factor):
    routing = MoeRouting(kind, factor)
    for tokens, k, experts in [(7, 1, 3), (64, 2, 4), (33, 3, 8), (10, 4, 4)]:
        idx = routing.expert_indices(tokens, k, experts)
        assert idx.shape == (tokens, k) and int(idx.min()) >= 0 and int(idx.max()) < experts
        assert all(len(set(row.tolist())) == k for row in idx)
        loads = torch.bincount(idx.flatten(), minlength=experts)
        expected_first = tokens if k == experts else routing.top_load(tokens, k, experts)
        assert int(loads[0]) == expected_first and int(loads.min()) >= 1  # every expert runs
        assert int(loads[1:].max()) - int(loads[1:].min()) <= 1  # the others share the rest evenly
        if kind == "worst" and k < experts:  # every token but those the other experts need one each
            assert expected_first == min(tokens, tokens * k - (experts - 1))


@pytest.mark.parametrize("text, message", [
    ("capacity:0.5", "capacity factor must be >= 1, got 'capacity:0.5'"),
    ("capacity", "needs a factor, e.g. capacity:1.25, got 'capacity'"),
    ("uniform", "must be balanced, capacity:C .* or worst, got 'uniform'"),
])
def test_bad_routing_is_refused_naming_the_flag(text, message, tmp_path, capsys):
    with pytest.raises(ValueError, match=message):
        parse_moe_routing(text)
    rc = main(["collect", "--hf-config", str(tmp_path / "none.json"), "--moe-routing", text, "--quiet"])
    assert rc == 1 and "--moe-routing" in capsys.readouterr().err


def _grads(model, inputs) -> dict:
    torch.manual_seed(1)
    model(**inputs).loss.backward()
    return {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("implementation", [None, "eager"], ids=["grouped_mm", "eager"])
def test_plan_applies_to_the_default_model_with_equal_gradients(implementation):
    config = TINY_MIXTRAL if implementation is None else {**TINY_MIXTRAL, "experts_implementation": implementation}
    built = _build(config, batch=4, seq=64)  # activations outweigh the parameters and AdamW's state
    stats = _collect(built)
    baseline = planner.baseline_peak_bytes(stats)
    # the first budget (from 75% of the baseline down) whose plan checkpoints the experts: that is the case
    plans = (planner.plan(stats, f * baseline / planner.GIB) for f in (0.75, 0.7, 0.65, 0.6, 0.55, 0.8, 0.85))
    plan = next((p for p in plans if p.status in ("optimal", "feasible")
                 and any(m.fqn.endswith("mlp.experts") for m in p.modules)), None)
    assert plan is not None, "no plan between 55% and 85% of the baseline checkpoints the experts"
    planned = apply_plan(copy.deepcopy(built.model), plan, stats=stats)
    want, got = _grads(copy.deepcopy(built.model), built.inputs), _grads(planned, built.inputs)
    for name, g in want.items():
        torch.testing.assert_close(got[name], g, rtol=1e-5, atol=1e-6, msg=name)


def test_recomputed_router_replays_the_forward_routing():
    """The whole MoE block (router included) checkpointed with every op recomputed: the recompute's top-k
    equals the forward's (deterministic kernels on the same inputs) and gradients equal the unplanned ones."""
    built = _build(TINY_MIXTRAL)
    stats = _collect(built)
    fqn = "MixtralForCausalLM.model.layers.0.mlp"
    ops = stats.module(fqn).ops
    assert "aten.topk" in [op.name for op in ops]
    plan = {"status": "optimal", "modules": [{"fqn": fqn, "discard_ratio": 1.0, "discarded_bytes": 0,
                                              "saved_bytes": 0, "recompute_ms": 0.0,
                                              "save": optimal_op_policy(ops, 0.0)}]}
    assert plan["modules"][0]["save"][[op.name for op in ops].index("aten.topk")] == 0  # recomputed
    planned = apply_plan(copy.deepcopy(built.model), plan, stats=stats)
    watch = TopKRecorder()
    with watch:
        got = _grads(planned, built.inputs)
    assert len(watch.indices) == 3  # layer 0 forward, layer 1 forward, layer 0 recompute
    forward, recompute = watch.indices[0], watch.indices[2]
    assert torch.equal(forward, recompute)
    for name, g in _grads(copy.deepcopy(built.model), built.inputs).items():
        torch.testing.assert_close(got[name], g, rtol=1e-5, atol=1e-6, msg=name)


def test_stats_of_another_experts_implementation_are_named_with_the_fix():
    stats = _collect(_build({**TINY_MIXTRAL, "experts_implementation": "batched_mm"}, "meta"))
    model = _build(TINY_MIXTRAL).model  # built as users do: the default experts
    settings = stats.metadata.model_settings
    assert settings["experts_implementation"] == "batched_mm"
    assert re.fullmatch(r"the stats were collected with experts_implementation 'batched_mm' but MixtralForCausalLM "
                        r"runs 'grouped_mm': call model\.set_experts_implementation\('batched_mm'\) .*",
                        experts_mismatch(model, settings))
    model.set_experts_implementation("batched_mm")
    assert experts_mismatch(model, settings) is None

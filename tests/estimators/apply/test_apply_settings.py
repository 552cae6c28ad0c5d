"""The model settings contract (issue 17, point 4) and the alignment of traced op sequences (point 1).

Stats record the settings that decide which ops run; ``apply_plan`` makes a
model as users build it (``AutoModelForCausalLM.from_config(cfg)``: KV cache
on, its default attention) match where training does, and refuses the rest.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from apply_cases import SEQ, TINY, assert_same_grads, grads_after, layer_plan, make_case  # noqa: E402
from estimators import PlanMismatchError, RooflineCostModel, apply_plan, collect_stats, device_spec  # noqa: E402
from estimators.apply import AmbiguousAlignment, StatsOps, align  # noqa: E402


@pytest.fixture(scope="module")
def llama():
    return make_case("llama")


def _user_built(doc: dict, **kwargs):
    """The model as a user builds it from the same config: nothing switched off, its default attention."""
    from transformers import AutoConfig, AutoModelForCausalLM

    doc = dict(doc)
    cfg = AutoConfig.for_model(doc.pop("model_type"), **doc)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, **kwargs).train()


def test_collector_records_the_settings_it_ran(llama):
    settings = llama.stats.metadata.model_settings
    assert (settings["use_cache"], settings["attn_implementation"], settings["training"]) == (False, "sdpa", True)
    assert llama.stats.metadata.dtype == "fp32"


def test_hf_defaults_train_with_the_plan(llama):
    """model(input_ids=ids, labels=ids) on the user's model: use_cache is switched off, gradients as unplanned."""
    user = _user_built(TINY["llama"])
    assert user.config.use_cache is True  # HF's default, which makes the layers build a KV cache
    want = grads_after(llama, _user_built(TINY["llama"]))
    planned = apply_plan(user, llama.plan, stats=llama.stats, example_inputs=llama.inputs)
    assert planned.config.use_cache is False
    got = grads_after(llama, planned)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=0)
    assert_same_grads(got[1], want[1])


def test_other_attention_implementation_is_refused_naming_the_setting(llama):
    user = _user_built(TINY["llama"], attn_implementation="eager")
    with pytest.raises(PlanMismatchError, match="model setting attn_implementation is 'eager' but the stats were "
                                                "collected with 'sdpa'"):
        apply_plan(user, llama.plan, stats=llama.stats)


def test_other_dtype_is_refused_naming_the_setting(llama):
    with pytest.raises(PlanMismatchError, match="model setting dtype is 'bf16' but the stats were collected with "
                                                "'fp32'"):
        apply_plan(llama.fresh().to(torch.bfloat16), llama.plan, stats=llama.stats)


def test_gemma2_collects_with_its_own_attention():
    """Gemma2ForCausalLM does not support SDPA (transformers raises if asked): the model's own is used."""
    from estimators import build_from_hf_config

    doc = {"model_type": "gemma2", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
    built = build_from_hf_config(doc, batch_size=1, seq_len=SEQ, dtype=torch.float32, device=torch.device("cpu"))
    assert "does not support sdpa" in built.notes["attention"]
    stats = collect_stats(built.model, built.inputs, device="cpu", cost_model=RooflineCostModel(device_spec("cpu")))
    assert stats.metadata.model_settings["attn_implementation"] == "eager"  # transformers' fallback


def test_eval_mode_stats_name_the_cause(llama):
    model = llama.fresh().eval()
    stats = collect_stats(model, llama.inputs, device="cpu", cost_model=RooflineCostModel(device_spec("cpu")))
    model.train()  # the plan is applied to training, where dropout runs
    plan = layer_plan(stats, [m["fqn"] for m in llama.plan["modules"]])
    with pytest.raises(PlanMismatchError, match=r"op \d+ is aten\.\w+ but the plan's stats have \S+\. "
                                                r"Likely cause: the stats were collected in eval mode"):
        apply_plan(model, plan, stats=stats, example_inputs=llama.inputs)


def test_cuda_target_stats_on_cpu_name_the_cause(llama):
    """Stats collected for a GPU (CUDA attention kernels emulated) do not map onto a CPU run."""
    from estimators import build_from_hf_config

    doc = {**TINY["llama"], "attention_dropout": 0.0, "num_key_value_heads": 4}  # what CUDA runs fused in fp32
    built = build_from_hf_config(doc, batch_size=2, seq_len=SEQ,
                                 dtype=torch.float32, device=torch.device("cpu"))
    stats = collect_stats(built.model, built.inputs, device="cpu", emulate_cuda_attention=True,
                          cost_model=RooflineCostModel(device_spec("A100-80GB")))
    fqn = llama.plan["modules"][0]["fqn"]
    plan = {"status": "optimal", "modules": [{**llama.plan["modules"][0],
                                              "save": [0] * len(stats.module(fqn).ops)}]}
    with pytest.raises(PlanMismatchError, match=r"Likely cause: the stats were collected for a CUDA target .* "
                                                r"fix: collect with --target-device cpu"):
        apply_plan(built.model, plan, stats=stats, example_inputs=built.inputs)


# Alignment of a recorded (traced) sequence with the stats'. Known answers worked out by hand.
def _ops(names, save, random=()):
    return StatsOps(tuple(names), tuple(save), tuple(n in ("view", "t") for n in names),
                    tuple(i in random for i in range(len(names))))


def _align(stats, names, random=()):
    return align(stats, names, [n in ("view", "t", "unsqueeze") for n in names],
                 [i in random for i in range(len(names))])


def test_alignment_carries_decisions_across_views_and_constants():
    stats = _ops(["mm", "view", "relu", "mm"], [1, 0, 0, 1])
    a = _align(stats, ["mm", "unsqueeze", "scalar_tensor", "relu", "view", "mm"])
    assert a.save == (1, 0, 0, 0, 0, 1) and a.unseen == 2 and a.lost_saves == ()


def test_alignment_same_named_insertion_maps_or_refuses():
    """An extra mm: where every longest alignment agrees the decisions carry; where they do not, the error."""
    agree = _ops(["mm", "relu", "mm"], [0, 0, 0])
    assert _align(agree, ["mm", "mm", "relu", "mm"]).save == (0, 0, 0, 0)
    differ = _ops(["mm", "relu", "mm"], [1, 0, 0])  # the saved mm could be run op 0 or run op 1
    with pytest.raises(AmbiguousAlignment, match=r"op 0 \(mm\) could be the stats' op \[0\] or an op the stats "
                                                 r"did not see"):
        _align(differ, ["mm", "mm", "relu", "mm"])
    unique = _align(differ, ["mm", "relu", "add", "mm"])  # an op of another name: one longest alignment
    assert unique.save == (1, 0, 0, 0)


def test_alignment_random_ops_follow_the_module_rule_and_lost_saves_are_reported():
    stats = _ops(["empty_like", "bernoulli_", "div_", "mul", "mm"], [1, 1, 1, 0, 1], random=(1,))
    a = _align(stats, ["native_dropout", "mm"], random=(0,))  # compile's single dropout op
    assert a.save == (1, 1) and a.lost_saves == (0, 1, 2)

"""Collecting one rank of an FSDP2 job under PyTorch's fake process group (estimators/collect/fsdp.py)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from estimators import FsdpSetup, RooflineCostModel, build_from_hf_config, collect_stats, device_spec  # noqa: E402
from estimators import CollectRequest, run_collection  # noqa: E402
from est_helpers import TINY_LLAMA  # noqa: E402
from planner import baseline_peak_bytes, min_feasible_budget_gib, plan  # noqa: E402

LAYERS = ["LlamaForCausalLM.model.layers.0", "LlamaForCausalLM.model.layers.1"]


def _tiny_llama():
    return build_from_hf_config(TINY_LLAMA, batch_size=2, seq_len=32, dtype=torch.float32,
                                device=torch.device("meta"))


def _collect(built, fsdp):
    return collect_stats(built.model, built.inputs, loss_fn=built.loss_fn, fsdp=fsdp,
                         cost_model=RooflineCostModel(device_spec("cpu")))


@pytest.fixture(scope="module")
def plain():
    return _collect(_tiny_llama(), None)


def _shard_bytes(model, world_size: int) -> int:
    """One rank's parameter bytes: FSDP2 shards each parameter on dim 0 into world_size chunks, padded to equal size.

    (torch.distributed.fsdp.fully_shard's documentation: "shards ... on dim-0"; the padding makes every
    rank's local shard ceil(dim0 / world_size) rows.)
    """
    return sum(math.ceil(p.shape[0] / world_size) * (p.numel() // p.shape[0]) * p.element_size()
               for p in model.parameters())


@pytest.mark.parametrize("world_size", [2, 4])
def test_per_rank_stats_under_the_fake_process_group(plain, world_size):
    built = _tiny_llama()
    stats = _collect(built, FsdpSetup(world_size))
    sh = stats.metadata.sharding
    assert (sh.kind, sh.world_size, sh.units) == ("fsdp2", world_size, LAYERS + ["LlamaForCausalLM"])
    assert (sh.mixed_precision, sh.reshard_after_forward) == (None, True)
    assert not dist.is_initialized()  # the fake group is gone: the next collection (the other parameter) can run
    assert stats.root.param_bytes == _shard_bytes(built.model, world_size)
    assert stats.root.param_bytes < plain.root.param_bytes
    # AdamW keeps two states the size of each (sharded) parameter, plus a scalar step per parameter
    n_params = len(list(built.model.parameters()))
    assert stats.root.optimizer_state_bytes == 2 * stats.root.param_bytes + 4 * n_params
    # collectives and FSDP2's copies are never a module's ops: the op lists are the unsharded step's
    for m in plain.modules:
        if m.ops is not None:
            assert [o.name for o in stats.module(m.fqn).ops] == [o.name for o in m.ops], m.fqn
    # a per-rank baseline is used as it is, and the world size it was collected at means the same
    assert baseline_peak_bytes(stats, world_size=world_size) == baseline_peak_bytes(stats)
    assert baseline_peak_bytes(stats) < baseline_peak_bytes(plain)


def test_plans_never_checkpoint_around_a_unit(plain):
    stats = _collect(_tiny_llama(), FsdpSetup(2))
    p = plan(stats, min_feasible_budget_gib(stats))
    assert p.status == "optimal" and p.modules
    for m in p.modules:  # fsdp_units come from the stats: no checkpointed module contains a unit
        assert not any(u.startswith(m.fqn + ".") for u in stats.metadata.sharding.units), m.fqn
    with pytest.raises(ValueError, match="world_size 3 does not match the stats.*world size 2"):
        plan(stats, 1.0, world_size=3)


def test_mixed_precision_and_no_reshard_change_the_step():
    built = _tiny_llama()
    fp32 = _collect(built, FsdpSetup(2))
    bf16 = _collect(built, FsdpSetup(2, mixed_precision="bf16"))
    kept = _collect(built, FsdpSetup(2, reshard_after_forward=False))
    assert bf16.metadata.sharding.mixed_precision == "bf16"
    assert bf16.root.param_bytes == fp32.root.param_bytes  # fp32 shards either way
    layer = LAYERS[0]
    # bf16 compute: the activations the layer saves are smaller
    assert bf16.module(layer).act_saved_bytes < fp32.module(layer).act_saved_bytes
    # kept gathered from forward to backward: at the end of the forward every unit is still gathered
    last_fw = [t for t in fp32.timeline if t.phase == "forward"][-1]
    last_fw_kept = [t for t in kept.timeline if t.phase == "forward"][-1]
    assert last_fw_kept.activation_bytes > last_fw.activation_bytes


def test_explicit_wrap_classes_and_their_errors():
    built = _tiny_llama()
    stats = _collect(built, FsdpSetup(2, wrap=("LlamaMLP",)))
    assert stats.metadata.sharding.units == [f"{x}.mlp" for x in LAYERS] + ["LlamaForCausalLM"]
    # a layer holds a unit (its MLP): only with the stats' units overridden may it be checkpointed
    budget, layer = 0.97 * baseline_peak_bytes(stats) / 2**30, LAYERS[:1]
    assert plan(stats, budget, ac_units=layer).status == "infeasible"
    assert [m.fqn for m in plan(stats, budget, ac_units=layer, fsdp_units=[]).modules] == layer
    with pytest.raises(ValueError, match="fsdp_wrap\\[0\\] 'Block' is no class of the model's modules"):
        _collect(built, FsdpSetup(2, wrap=("Block",)))
    with pytest.raises(ValueError, match="names no FSDP units.*--fsdp-wrap"):
        _collect_model_without_units()
    assert not dist.is_initialized()


def _collect_model_without_units():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    return collect_stats(model, torch.randn(4, 8), fsdp=FsdpSetup(2), cost_model=RooflineCostModel(device_spec("cpu")))


@pytest.mark.parametrize("fields, message", [
    ({"fsdp_world_size": 2, "mixed_precision": "bf16", "dtype": "bf16"}, "use --dtype fp32, got --dtype bf16"),
    ({"fsdp_wrap": ["LlamaDecoderLayer"]}, "--fsdp-wrap shards the step: it needs --fsdp-world-size N"),
    ({"mixed_precision": "bf16"}, "--mixed-precision shards the step"),
    ({"reshard_after_forward": False}, "--no-reshard-after-forward shards the step"),
    ({"fsdp_world_size": 2, "mixed_precision": "fp8"}, "mixed_precision must be one of bf16 or None, got 'fp8'"),
])
def test_request_errors_name_the_flag(fields, message):
    with pytest.raises(ValueError, match=message):
        run_collection(CollectRequest(hf_config=dict(TINY_LLAMA), batch=1, seq=8, **fields))


def test_mixed_precision_needs_fp32_parameters():
    built = _tiny_llama()
    with pytest.raises(ValueError, match="dtype must be None or torch.float32, got torch.bfloat16"):
        collect_stats(built.model, built.inputs, dtype=torch.bfloat16, fsdp=FsdpSetup(2, mixed_precision="bf16"),
                      cost_model=RooflineCostModel(device_spec("cpu")))


def test_setup_validation():
    with pytest.raises(ValueError, match="fsdp_world_size must be a positive integer, got 0"):
        FsdpSetup(0)
    with pytest.raises(ValueError, match="fsdp_wrap must be a list of class names, got the string 'LlamaMLP'"):
        FsdpSetup(2, wrap="LlamaMLP")


def test_cli_collects_one_rank_and_plans_it(tmp_path, capsys):
    import json

    from planner import load_stats
    from planner.cli import main

    config, out = tmp_path / "tiny_llama.json", tmp_path / "s.json"
    config.write_text(json.dumps(TINY_LLAMA))
    assert main(["collect", "--hf-config", str(config), "--batch", "2", "--seq", "32", "--fsdp-world-size", "2",
                 "--fsdp-wrap", "LlamaDecoderLayer", "--mixed-precision", "bf16", "--out", str(out), "--quiet"]) == 0
    stats = load_stats(out)
    assert stats.metadata.sharding.model_dump() == {"kind": "fsdp2", "world_size": 2, "units": LAYERS + [
        "LlamaForCausalLM"], "mixed_precision": "bf16", "reshard_after_forward": True}
    capsys.readouterr()
    assert main(["plan", str(out), "--budget-gib", "1", "--world-size", "4"]) == 1
    assert "--world-size 4 does not match the stats" in capsys.readouterr().err

"""Collecting one rank of a tensor-parallel job under PyTorch's fake process group (issue 29).

Known answers: a column-wise Linear(64, 128) split over 2 ranks holds half its weight, 64 x 64 fp32 =
16,384 bytes (torch.distributed.tensor.parallel.ColwiseParallel shards the weight on dim 0); a
row-wise layer's partial sums are all-reduced once per call (RowwiseParallel's output Replicate).
With sequence parallel (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", section 4.2.2: each all-reduce becomes a reduce-scatter onto sequence shards and an all-gather
before the next column-wise layers), a rank's norms run on seq / TP tokens.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from estimators import (CollectRequest, FsdpSetup, ParallelDims, RooflineCostModel,  # noqa: E402
                        build_from_hf_config, collect_stats, device_spec)
from est_helpers import TINY_LLAMA  # noqa: E402
from estimators.common import PipelineSetup  # noqa: E402
from planner import MUST_SAVE_OPS, OpStats, min_feasible_budget_gib, plan  # noqa: E402
from planner.ops.groups import SAVE, op_groups  # noqa: E402

LLAMA = {**TINY_LLAMA, "attention_dropout": 0.0}
LAYER = "LlamaForCausalLM.model.layers.0"

USER_FN = '''
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

def parallelize(model, tp_mesh):
    parallelize_module(model, tp_mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
'''


def _collect(model, inputs, loss_fn=None, **kw):
    return collect_stats(model, inputs, loss_fn=loss_fn, cost_model=RooflineCostModel(device_spec("cpu")), **kw)


@pytest.fixture(scope="module")
def tp_llama():
    built = build_from_hf_config(LLAMA, batch_size=2, seq_len=32, dtype=torch.float32, device=torch.device("meta"))
    return _collect(built.model, built.inputs, built.loss_fn, parallel=ParallelDims(tp_size=2))


def test_hf_plan_rank_holds_shards_and_its_collectives_are_must_save_ops(tp_llama) -> None:
    sharding = tp_llama.metadata.sharding
    assert (sharding.kind, sharding.world_size, sharding.tp_size, sharding.tp_plan) == ("tp", 1, 2, "hf:tp_plan")
    q_proj = tp_llama.module(f"{LAYER}.self_attn.q_proj")
    assert q_proj.param_bytes == 32 * 64 * 4  # q_proj (64 -> 64) column-wise over 2 ranks: 32 rows of 64
    names = [op.name for op in tp_llama.module(f"{LAYER}.self_attn").ops]
    must = [op.name for op in tp_llama.module(f"{LAYER}.self_attn").ops if op.must_save]
    # o_proj is row-wise: its partial sums all-reduced, the result wrapped for a later wait, as eager runs it
    assert must == ["_c10d_functional.all_reduce", "_c10d_functional._wrap_tensor_autograd"]
    assert "_c10d_functional.wait_tensor" not in names
    assert set(must) <= MUST_SAVE_OPS


def test_hf_plan_with_sequence_parallel_shards_the_norms_and_swaps_the_all_reduce() -> None:
    built = build_from_hf_config(LLAMA, batch_size=2, seq_len=32, dtype=torch.float32, device=torch.device("meta"))
    stats = _collect(built.model, built.inputs, built.loss_fn, parallel=ParallelDims(tp_size=2,
                                                                                    sequence_parallel=True))
    sharding = stats.metadata.sharding
    assert (sharding.tp_plan, sharding.sequence_parallel) == ("hf:tp_plan+sequence_parallel", True)
    must = [op.name for op in stats.module(f"{LAYER}.self_attn").ops if op.must_save]
    # gathered once on entry (q, k and v share it), o_proj's partial sums reduce-scattered onto sequence shards
    assert must == ["_c10d_functional.all_gather_into_tensor", "_c10d_functional._wrap_tensor_autograd",
                    "_c10d_functional.reduce_scatter_tensor", "_c10d_functional._wrap_tensor_autograd"]
    for norm in (f"{LAYER}.input_layernorm", f"{LAYER}.post_attention_layernorm", "LlamaForCausalLM.model.norm"):
        # its output, a DTensor counted as its local shard: batch 2 x (seq 32 / 2 ranks) x hidden 64, fp32
        assert stats.module(norm).output_bytes == 2 * 16 * 64 * 4, norm
    model = nn.Sequential(nn.Linear(64, 128, bias=False), nn.Linear(128, 64, bias=False))
    model.tp_plan = {"0": "colwise", "1": "rowwise_rep"}
    with pytest.raises(ValueError, match="style 'rowwise_rep' is not derived for sequence parallel"):
        _collect(model, torch.ones(4, 64), lambda out: out.sum(), parallel=ParallelDims(tp_size=2,
                                                                                      sequence_parallel=True))


def test_every_plan_saves_the_collectives(tp_llama) -> None:
    """At the smallest feasible budget (most recomputed) the MILP still saves every must_save op."""
    p = plan(tp_llama, min_feasible_budget_gib(tp_llama))
    assert p.status == "optimal" and p.modules
    for m in p.modules:
        ops = tp_llama.module(m.fqn).ops
        assert all(s == 1 for s, op in zip(m.save, ops) if op.must_save), m.fqn


def test_tp_fields_are_left_out_when_absent() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    doc = json.loads(_collect(model, torch.ones(4, 8), lambda out: out.sum(),
                              fsdp=FsdpSetup(2, wrap=("Linear",))).model_dump_json())
    assert "tp_size" not in doc["metadata"]["sharding"] and "tp_plan" not in doc["metadata"]["sharding"]
    assert not any("must_save" in op for m in doc["modules"] for op in (m["ops"] or ()))


def test_user_function_and_2d_mesh(tmp_path) -> None:
    path = tmp_path / "tp_plan.py"
    path.write_text(USER_FN)
    model = nn.Sequential(nn.Linear(64, 128, bias=False), nn.ReLU(), nn.Linear(128, 64, bias=False))
    with pytest.raises(ValueError, match="no Hugging Face tensor-parallel plan"):
        _collect(model, torch.ones(4, 64), lambda out: out.sum(), parallel=ParallelDims(tp_size=2))
    stats = _collect(model, torch.ones(4, 64), lambda out: out.sum(), parallel=ParallelDims(
        tp_size=2, parallelize=f"{path}:parallelize"))
    assert stats.metadata.sharding.tp_plan == f"{path}:parallelize"
    assert stats.modules[0].param_bytes == 2 * 64 * 64 * 4  # each Linear's half (64 x 128 split on 128)
    # FSDP2 over TP (a 2 x 2 mesh): each TP shard halved again on its dim 0
    two_d = _collect(model, torch.ones(4, 64), lambda out: out.sum(), parallel=ParallelDims(
        fsdp=FsdpSetup(2, wrap=("Linear",)), tp_size=2, parallelize=f"{path}:parallelize"))
    assert (two_d.metadata.sharding.kind, two_d.metadata.sharding.world_size) == ("fsdp2", 2)
    assert two_d.modules[0].param_bytes == 64 * 64 * 4


def test_bad_settings_are_named() -> None:
    with pytest.raises(ValueError, match="tp_size must be a positive integer, got 0"):
        ParallelDims(tp_size=0)
    with pytest.raises(ValueError, match="sequence_parallel True needs tensor parallel"):
        ParallelDims(sequence_parallel=True)
    with pytest.raises(ValueError, match="parallelize must look like path/to/file.py:fn"):
        ParallelDims(tp_size=2, parallelize="plan.py")


def test_parallel_dims_holds_the_pipeline() -> None:
    req = CollectRequest(hf_config=LLAMA, pp_stages=2, pp_schedule="gpipe", microbatches=4)
    dims = req.parallel_dims()
    assert dims.pp == PipelineSetup(2, "gpipe", 4) and (dims.fsdp, dims.tp_size) == (None, 1)
    assert (dims.world_size, dims.stage_world_size) == (2, 1)  # two stages of one rank each
    assert CollectRequest(hf_config=LLAMA).parallel_dims() is None
    with pytest.raises(ValueError, match="pp must be a PipelineSetup or None, got int"):
        ParallelDims(pp=2)
    with pytest.raises(ValueError, match="a pipeline is collected stage by stage"):
        _collect(nn.Linear(4, 4), torch.ones(2, 4), lambda out: out.sum(), parallel=dims)


def test_pipeline_stages_collect_one_tensor_parallel_rank_each() -> None:
    # PP x TP: each stage's rank holds its shards of the stage (the model's HF plan names the stage's modules, whose
    # FQNs are the model's); its collectives are must-save ops. Held to a real 2 x 2 gloo job in bench/RESULTS.md,
    # "Pipeline parallel x tensor parallel".
    from estimators.collect import run_pipeline_collection

    cfg = {**LLAMA, "tie_word_embeddings": False}
    plain = run_pipeline_collection(CollectRequest(hf_config=cfg, batch=2, seq=32, pp_stages=2, microbatches=2))
    tp = run_pipeline_collection(CollectRequest(hf_config=cfg, batch=2, seq=32, pp_stages=2, microbatches=2,
                                                tp_size=2))
    for whole, rank in zip(plain, tp):
        assert rank.stats.metadata.sharding.tp_size == 2 and rank.stats.metadata.pipeline is not None
        assert rank.stats.root.param_bytes < 0.6 * whole.stats.root.param_bytes  # the projections split in two
        layer = next(m for m in rank.stats.modules if m.fqn.endswith("self_attn"))
        assert any(op.must_save and op.name in MUST_SAVE_OPS for op in layer.ops)
    with pytest.raises(ValueError, match="--fsdp-world-size is not collected with --pp-stages yet"):
        CollectRequest(hf_config=cfg, pp_stages=2, tp_size=2, fsdp_world_size=2).pipeline_setup()


def test_must_save_fixes_the_group() -> None:
    ops = [OpStats(name="aten.mm", runtime_ms=1.0, output_bytes=64),
           OpStats(name="_c10d_functional.all_reduce", runtime_ms=0.5, output_bytes=64, must_save=True)]
    groups = op_groups(ops)
    assert [int(f) for f in groups.fixed] == [-1, SAVE]

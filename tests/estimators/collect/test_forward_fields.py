"""The forward-moment fields of collected stats, and every engine planning with them (a small OPT, 3 s to collect).

The fields (``forward_key``, ``forward_live_bytes``, ``unsaved_last_ops``) let the memory model give a checkpointed
module's own forward moments what its save list holds (docs/memory-model.md); the real steps that hold the model to
them are in ``tests/estimators/measure/test_forward_moments.py``. Here: what the fields say of the step, that stats
without them are read and planned as before, and that the MILP, whose rows carry the term exactly, and the DP, whose
frontiers leave it out and whose plans are checked, agree at every budget (each plan within its budget).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

import planner  # noqa: E402
from estimators import CollectRequest, run_collection  # noqa: E402
from planner.solve.forward_rows import forward_rows_of, with_forward_rows  # noqa: E402
from planner.solve.problem import prepare  # noqa: E402
from planner.stats.format import stats_hash  # noqa: E402

TINY_OPT = {"model_type": "opt", "vocab_size": 256, "hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "max_position_embeddings": 128, "word_embed_proj_dim": 64, "dropout": 0.1,
            "attention_dropout": 0.1, "layerdrop": 0.0}
NEW_FIELDS = ("forward_key", "forward_live_bytes", "unsaved_last_ops")


@pytest.fixture(scope="module")
def stats():
    return run_collection(CollectRequest(hf_config=TINY_OPT, batch=2, seq=64, dtype="fp32", device="cpu",
                                         optimizer="adamw")).stats


def _without_new_fields(stats) -> planner.Stats:
    doc = json.loads(stats.model_dump_json())
    for m in doc["modules"]:
        for op in m.get("ops") or ():
            for name in NEW_FIELDS:
                op.pop(name, None)
    return planner.Stats.model_validate(doc)


def test_every_op_says_where_it_runs_and_when_its_storages_die_unsaved(stats):
    n_modules = len(stats.fw_post_order)
    post = {f: k for k, f in enumerate(stats.fw_post_order)}
    for m in stats.modules:
        keys = [op.forward_key for op in m.ops or ()]
        assert all(k is not None and 0 <= k <= post[m.fqn] < n_modules for k in keys), m.fqn
        assert keys == sorted(keys), m.fqn  # ops run in forward order, and keys only grow
        for op in m.ops or ():
            assert op.forward_live_bytes is not None and op.forward_live_bytes > 0
            # with nothing saved a storage dies no later than in the step, and one nothing saves dies as early
            for (nbytes, last, saved), unsaved in zip(op.storages or (), op.unsaved_last_ops or ()):
                assert unsaved <= last
                if not saved and last < len(m.ops):
                    assert unsaved == last, (m.fqn, op.name)
    # the attention's softmax, saved for backward by the step, dies with nothing saved once its dropout ran
    attn = stats.module("OPTForCausalLM.model.decoder.layers.0.self_attn")
    softmax = next(op for op in attn.ops if op.name == "aten._safe_softmax")
    assert softmax.storages[0][1] == len(attn.ops) and softmax.unsaved_last_ops[0] < len(attn.ops)


def test_stats_without_the_fields_read_hash_and_plan_as_before(stats):
    old = _without_new_fields(stats)
    again = planner.Stats.model_validate(json.loads(old.model_dump_json()))
    assert stats_hash(again) == stats_hash(old)  # absent fields are left out of the document, not written null
    assert not any(name in old.model_dump_json() for name in NEW_FIELDS)
    assert planner.memory_model(old).forward_ops == {} and with_forward_rows(prepare(old)) is None
    assert forward_rows_of(with_forward_rows(prepare(stats)))  # the attention's saved scores go above the step


@pytest.mark.parametrize("fraction", [0.75, 0.8, 0.85, 0.9])
def test_milp_and_dp_agree_within_budget(stats, fraction: float):
    baseline = planner.plan(stats, 1024.0).baseline_peak_bytes
    budget = fraction * baseline / planner.GIB
    relaxed = planner.plan(_without_new_fields(stats), budget, solver="dp")  # the forward term left out: a bound
    plans = {solver: planner.plan(stats, budget, solver=solver) for solver in ("milp", "auto")}
    for solver, p in plans.items():
        assert p.status == "optimal", (solver, p.message)
        assert p.peak_bytes <= p.memory_budget_gib * planner.GIB + 1e-6
        assert p.recompute_ms >= relaxed.recompute_ms * (1 - 1e-6)
    assert plans["auto"].recompute_ms == pytest.approx(plans["milp"].recompute_ms, rel=1e-6)
    off = planner.plan(stats, budget, offload="on", host_link_gbps=1e6)
    assert off.status == "optimal" and off.peak_bytes <= off.memory_budget_gib * planner.GIB + 1e-6


def _with_forward_load(stats, key: int, nbytes: int) -> planner.Stats:
    """``stats`` with ``nbytes`` more live through the forward moment ``key`` (the plain step's and each op's
    there): a step whose forward there comes near its backward peak."""
    doc = json.loads(stats.model_dump_json())
    for t in doc["timeline"]:
        if t["phase"] == "forward" and t["key"] == key:
            t["activation_bytes"] += nbytes
    for m in doc["modules"]:
        for op in m.get("ops") or ():
            if op.get("forward_key") == key:
                op["forward_live_bytes"] += nbytes
    return planner.Stats.model_validate(doc)


def test_where_the_forward_binds_the_dp_hands_over_to_the_milp(stats):
    # the last forward moment of layers.1.self_attn (its softmax, dropout and attn @ v) loaded to 95% of the step's
    # peak: at 75% the DP's best plan (the term left out) saves ops that put it over there (found by a scan of
    # loads and budgets); the MILP's rows have it
    attn = stats.module("OPTForCausalLM.model.decoder.layers.1.self_attn")
    key = max(op.forward_key for op in attn.ops)
    model = planner.memory_model(stats)
    at = (model.keys == key) & np.array([ph == "forward" for ph in model.phases])
    loaded = _with_forward_load(stats, key, int(0.95 * model.base_bytes.max() - model.base_bytes[at].max()))
    budget = 0.75 * planner.plan(loaded, 1024.0).baseline_peak_bytes / planner.GIB
    by_name = planner.plan(loaded, budget, solver="dp")  # re-solved under a lowered budget: not proven
    assert by_name.status == "feasible" and "lowered" in by_name.message
    milp, auto = planner.plan(loaded, budget, solver="milp"), planner.plan(loaded, budget)
    relaxed = planner.plan(_without_new_fields(loaded), budget)
    assert milp.status == auto.status == "optimal"
    assert auto.recompute_ms == pytest.approx(milp.recompute_ms, rel=1e-9)
    assert relaxed.recompute_ms * (1 - 1e-6) <= milp.recompute_ms < by_name.recompute_ms
    for p in (by_name, milp, auto):
        assert p.peak_bytes <= p.memory_budget_gib * planner.GIB + 1e-6

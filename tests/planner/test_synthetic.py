"""The synthetic N-layer generator of bench/synthetic.py makes documents the planner accepts."""

import importlib.util
import json
from pathlib import Path

import pytest

import planner

ROOT = Path(__file__).resolve().parents[2]
L4 = ROOT / "tests" / "data" / "torch_format_transformer_L4.json"


def _synthetic():
    spec = importlib.util.spec_from_file_location("bench_synthetic", ROOT / "bench" / "synthetic.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


synthetic = _synthetic()


@pytest.fixture(scope="module")
def source():
    return json.loads(L4.read_text())


def test_same_depth_reproduces_the_source(source):
    # Repeating block 1 of the 4-block sample 4 times must give the sample back:
    # the sample's blocks differ only by the constant shifts the generator applies.
    doc = synthetic.make_layers(source, 4)
    assert doc["module_info"]["mod_order"] == source["module_info"]["mod_order"]
    assert doc["sac_stats"] == source["sac_stats"]
    fitted = {"slopes", "intercepts", "breakpoints", "tradeoff_curve"}
    for got, want in zip(doc["module_info"]["mod_stats"], source["module_info"]["mod_stats"], strict=True):
        assert {k: v for k, v in got.items() if k not in fitted} == {k: v for k, v in want.items() if k not in fitted}


@pytest.mark.parametrize("n_layers", [1, 8])
def test_deeper_and_shallower_documents_validate(source, n_layers):
    doc = synthetic.make_layers(source, n_layers)
    stats = planner.parse_stats(doc)
    # 6 modules outside the stack, 14 per block (the sample: 6 + 4 * 14 = 62).
    assert len(stats.modules) == 6 + 14 * n_layers
    assert synthetic.layer_count(doc) == n_layers
    root_ops = doc["sac_stats"]["Transformer"]
    assert len(root_ops["func_names"]) == 8 + 71 * n_layers + 5
    assert stats.root.param_bytes == (
        source["module_info"]["mod_stats"][0]["param_per_module"] + (n_layers - 4) * 28339200
    )


def test_activations_grow_and_gradients_accumulate_per_block(source):
    doc = synthetic.make_layers(source, 8)
    by = {m["fqn"]: m for m in doc["module_info"]["mod_stats"]}
    d_act = by["Transformer.layers.1"]["act_total"] - by["Transformer.layers.0"]["act_total"]
    d_grad = by["Transformer.layers.1"]["grad_total"] - by["Transformer.layers.0"]["grad_total"]
    assert d_act > 0 and d_grad < 0
    for k in range(7):
        nxt, cur = by[f"Transformer.layers.{k + 1}.attention"], by[f"Transformer.layers.{k}.attention"]
        assert nxt["act_total"] - cur["act_total"] == d_act
        assert nxt["grad_total"] - cur["grad_total"] == d_grad
    # The last block runs backward right after the final norm and output, in
    # both models, so it has the same gradients accumulated as the sample's last.
    src = {m["fqn"]: m for m in source["module_info"]["mod_stats"]}
    assert by["Transformer.layers.7"]["grad_total"] == src["Transformer.layers.3"]["grad_total"]
    assert by["Transformer.norm"]["act_total"] == src["Transformer.norm"]["act_total"] + 4 * d_act


def test_rejects_a_bad_layer_count(source):
    with pytest.raises(ValueError, match="n_layers must be a positive integer"):
        synthetic.make_layers(source, 0)

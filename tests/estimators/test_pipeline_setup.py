"""A pipeline's layout (issue 30): validated where it is made, with the field and value named; the layers each
stage keeps; ``sacplan collect --pp-stages`` refusing what it cannot collect."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from estimators.collect import CollectRequest  # noqa: E402
from estimators.common import PipelineSetup, stage_layer_ids  # noqa: E402


@pytest.mark.parametrize("kwargs, match", [
    ({"stages": 1}, "pp_stages must be at least 2 for a pipeline, got 1"),
    ({"stages": 2, "microbatches": 0}, "microbatches must be a positive integer, got 0"),
    ({"stages": 2, "schedule": "zb"}, "pp_schedule must be one of gpipe, 1f1b, interleaved-1f1b, got 'zb'"),
    ({"stages": 2, "virtual_stages": 2}, "pp_virtual_stages 2 needs pp_schedule interleaved-1f1b, got '1f1b'"),
    ({"stages": 2, "schedule": "interleaved-1f1b", "virtual_stages": 2, "microbatches": 3},
     "microbatches 3 must be a multiple of pp_stages 2"),
    ({"stages": 3, "split": ("model.layers.2",)}, r"pp_split names 1 split points \['model.layers.2'\]; 3 model "
     r"chunks need 2"),
    ({"stages": 2, "split": "model.layers.2"}, "pp_split must be a list of module FQNs, got the string"),
])
def test_a_bad_layout_names_the_field_and_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PipelineSetup(**kwargs)


def test_each_stage_keeps_its_own_layers():
    assert stage_layer_ids(5, PipelineSetup(2)) == [[0, 1, 2], [3, 4]]  # equal counts, the remainder first
    assert stage_layer_ids(8, PipelineSetup(4)) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    split = PipelineSetup(3, split=("model.layers.1", "layers.5"))
    assert stage_layer_ids(8, split) == [[0], [1, 2, 3, 4], [5, 6, 7]]
    with pytest.raises(ValueError, match=r"pp_split\[1\] 'model.layers.1' must come after the previous split"):
        stage_layer_ids(8, PipelineSetup(3, split=("model.layers.4", "model.layers.1")))
    with pytest.raises(ValueError, match=r"pp_split\[0\] 'model.norm' is not a decoder layer"):
        stage_layer_ids(8, PipelineSetup(2, split=("model.norm",)))
    with pytest.raises(ValueError, match="4 chunks need at least 4 decoder layers, the model has 2"):
        stage_layer_ids(2, PipelineSetup(4))


@pytest.mark.parametrize("kwargs, match", [
    ({"pp_stages": 2, "grad_accumulation": 4}, "--grad-accumulation 4 with --pp-stages: the pipeline's microbatches "
     "are the accumulation; use --microbatches M"),
    ({"pp_stages": 2, "hf_config": None, "model": "m.py:f"}, "--pp-stages cuts a Hugging Face decoder"),
    ({"pp_stages": 2, "fsdp_world_size": 2}, "--fsdp-world-size is not collected with --pp-stages yet"),
    ({"pp_stages": 2, "tp_size": 2, "pp_virtual_stages": 2}, "--tp-size with --pp-virtual-stages 2: tensor "
     "parallel stages are collected for 1f1b and gpipe"),
    ({"microbatches": 4}, "--microbatches lays out a pipeline: it needs --pp-stages S"),
    ({"pp_stages": 2, "pp_split": ["auto"]}, "--pp-split auto chooses the split under a budget: give --budget-gib B"),
    ({"pp_stages": 2, "budget_gib": 4.0}, "--budget-gib 4 chooses a split: it needs --pp-split auto"),
])
def test_collect_refuses_what_a_pipeline_collection_cannot_do(kwargs, match):
    req = CollectRequest(**{"hf_config": "c.json", **kwargs})
    with pytest.raises(ValueError, match=match):
        req.pipeline_setup()

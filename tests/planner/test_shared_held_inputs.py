"""One tensor several checkpointed modules hold (an attention mask every layer takes) counts once.

Found on the fidelity harness's gemma2_eager (bench/RESULTS.md "Fidelity"):
its full-attention and sliding-window masks (1 MiB each) go to every
decoder layer and no op saves them, so checkpointing a layer holds its mask
until the layer's backward ends. Counted once per checkpointed layer, the
plan checkpointing layers 1-3 was predicted 1 MiB above its real peak
(layers 1 and 3 share the full mask), and the one checkpointing all four
2 MiB above (steady state real/predicted 0.97).
"""

from __future__ import annotations

import pytest

import planner
from planner import Stats


def _stats(*, numbered: bool = True, held_b: tuple[int, int] = (7, 100)) -> Stats:
    """Root M and two siblings M.a, M.b, each with one 1000-byte op autograd saves and a 100-byte held input."""
    def child(fqn: str, held: tuple[int, int]) -> dict:
        return {"fqn": fqn, "parent": "M", "is_leaf": False, "act_saved_bytes": 1000, "held_input_bytes": held[1],
                "held_inputs": [list(held)] if numbered else None,
                "ops": [{"name": "aten.mm", "runtime_ms": 1.0, "output_bytes": 1000}]}
    moments = [("forward", 2, 5000), ("backward", 2, 6000), ("backward", 1, 4000), ("backward", 0, 3000),
               ("optimizer", 0, 100)]
    return Stats.model_validate({
        "metadata": {"model_name": "two-siblings"}, "fw_pre_order": ["M", "M.a", "M.b"],
        "fw_post_order": ["M.a", "M.b", "M"],
        "modules": [{"fqn": "M", "parent": None, "is_leaf": False}, child("M.a", (7, 100)), child("M.b", held_b)],
        "timeline": [{"phase": p, "key": k, "activation_bytes": a} for p, k, a in moments]})


# Both checkpointed, every op recomputed: each discards 1000 - 100 (its held input) = 900 bytes.
# By hand, with the mask held once (from M.a's forward end to M.a's backward end):
#   forward key 2:   5000 - 2 * 1000 + 100 = 3100
#   backward key 2:  6000 - 2 * 1000 + 100 = 4100   (the peak: the root's backward starts)
#   backward key 1:  4000 - 1000 + 100     = 3100   (M.b's backward: M.a's discard still in effect)
#   backward key 0:  3000 + 100            = 3100   (M.a's backward, holding the mask)
#   optimizer:       100
# The engines count each module's held input on its own (900-byte discards), so they need a budget of
# 6000 - 1800 = 4200 bytes to checkpoint both.
BUDGET_GIB = 4200 / planner.GIB


def test_a_tensor_held_by_two_checkpointed_modules_counts_once():
    plan = planner.plan(_stats(), BUDGET_GIB)
    assert sorted(m.fqn for m in plan.modules) == ["M.a", "M.b"]
    assert plan.peak_bytes == 4100
    assert [t.planned_bytes for t in plan.timeline] == [3100, 4100, 3100, 3100, 100]


def test_without_numbers_or_with_two_tensors_each_counts_apart():
    # Older stats (no held_inputs) cannot tell one tensor from two: every module's held input counts.
    assert planner.plan(_stats(numbered=False), BUDGET_GIB).peak_bytes == 4200
    # Two different tensors: both are held at the root's backward.
    assert planner.plan(_stats(held_b=(8, 100)), BUDGET_GIB).peak_bytes == 4200


@pytest.mark.parametrize("held_b, match", [
    ((7, 50), r"modules\[2\].held_inputs add up to 50 bytes, not held_input_bytes 100"),
])
def test_held_inputs_must_add_up(held_b, match):
    doc = _stats().model_dump(mode="json")
    doc["modules"][2]["held_inputs"] = [list(held_b)]
    with pytest.raises(ValueError, match=match):
        Stats.model_validate(doc)


def test_one_tensor_has_one_size():
    doc = _stats().model_dump(mode="json")
    doc["modules"][2]["held_inputs"], doc["modules"][2]["held_input_bytes"] = [[7, 60]], 60
    with pytest.raises(ValueError, match=r"modules\[2\].held_inputs: tensor 7 has 60 bytes here and 100"):
        Stats.model_validate(doc)

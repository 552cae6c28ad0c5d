"""A checkpointed module's own forward moments (planner.ops.forward_moments, planner.solve.forward_rows), by hand.

No torch: modules of a few ops written out, their storages' lives chosen so each answer can be read off. The
figures the real steps hold the model to are in tests/estimators/measure/test_forward_moments.py.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from planner.ops.forward_moments import forward_excess_bytes, forward_held_bytes, forward_moments_known
from planner.ops.groups import op_groups
from planner.ops.knapsack import group_classes
from planner.solve.forward_rows import forward_rows, group_signatures
from planner.stats.format import ModuleStats
from planner.stats.op_format import OpStats


def _module(ops: list[dict]) -> ModuleStats:
    return ModuleStats(fqn="M.attn", parent="M", is_leaf=False, ops=[OpStats(**op) for op in ops])


def _op(name: str, nbytes: int, last: int, unsaved: int, key: int, live: int, saved: bool = False) -> dict:
    return {"name": name, "runtime_ms": 1.0, "output_bytes": nbytes, "saved_by_autograd": saved,
            "storages": [(nbytes, last, saved)], "unsaved_last_ops": [unsaved], "forward_key": key,
            "forward_live_bytes": live}


# An attention's shape, in miniature (4 ops, all at forward key 7, the plain step's most there 1000 bytes):
#   0 q: 100 bytes, freed by the plain step after op 1 (scaled): saved, SAC keeps it from op 2 on
#   1 scores: 400 bytes, saved for backward by the plain step (alive past the module: last 4), dies after op 2
#     with nothing saved: recomputed, it is gone from op 3 on
#   2 softmax: 300 bytes, freed after op 3 in both
#   3 out: 50 bytes, the module's output (outlives it)
OPS = [_op("aten.mm", 100, 1, 1, 7, 700), _op("aten.bmm", 400, 4, 2, 7, 900, saved=True),
       _op("aten.softmax", 300, 3, 3, 7, 1000), _op("aten.mm", 50, 4, 4, 7, 800)]


def test_held_bytes_per_op_by_hand():
    m = _module(OPS)
    assert forward_moments_known(m)
    # every op saved: q kept from op 2 on (+100 at ops 2, 3); scores alive as in the plain step
    assert forward_held_bytes(m, [1, 1, 1, 1]).tolist() == [700, 900, 1100, 900]
    # every op recomputed: the scores die after op 2 (-400 at op 3), q as in the plain step
    assert forward_held_bytes(m, [0, 0, 0, 0]).tolist() == [700, 900, 1000, 400]
    # q saved, scores recomputed: op 2 holds 1100 (q kept, scores still live), op 3 500
    assert forward_held_bytes(m, [1, 0, 1, 1]).tolist() == [700, 900, 1100, 500]
    assert forward_excess_bytes(m, [1, 0, 1, 1], {7: 1000.0}) == {7: 100.0}
    assert forward_excess_bytes(m, [0, 1, 1, 1], {7: 1000.0}) == {}  # never above the plain step's most
    assert forward_excess_bytes(m, [1, 1, 1, 1], {6: 1000.0}) == {}  # no moment known at its key: nothing


def test_stats_without_the_fields_add_nothing():
    ops = [{k: v for k, v in op.items() if k not in ("forward_key", "forward_live_bytes", "unsaved_last_ops")}
           for op in OPS]
    m = _module(ops)
    assert not forward_moments_known(m) and forward_excess_bytes(m, [1, 1, 1, 1], {7: 0.0}) == {}


def test_unsaved_last_ops_must_match_the_storages():
    from planner.stats.format import Stats
    bad = dict(OPS[0], unsaved_last_ops=[1, 1])
    doc = {"metadata": {"model_name": "M"}, "fw_pre_order": ["M", "M.attn"], "fw_post_order": ["M.attn", "M"],
           "modules": [{"fqn": "M", "parent": None, "is_leaf": False},
                       {"fqn": "M.attn", "parent": "M", "is_leaf": False, "ops": [bad]}]}
    with pytest.raises(ValueError, match=r"ops\[0\]\.unsaved_last_ops has 2 entries for 1 storages"):
        Stats.model_validate(doc)


@pytest.mark.parametrize("seed", range(6))
def test_rows_are_exact_for_every_save_list(seed: int):
    """The MILP's rows (const_j - sum_q W_q,j k_q) against held_S(j) - most, for every save list of random modules
    with storages of random lives (brute force over the free groups)."""
    rng = np.random.default_rng(seed)
    n = 6
    ops, live = [], 1000
    for i in range(n):
        nbytes = int(rng.integers(1, 5)) * 64
        last = int(rng.integers(i, n + 1))
        unsaved = int(rng.integers(i, last + 1))
        live += nbytes - int(rng.integers(0, 2)) * 64
        ops.append(_op(f"aten.op{i % 2}", nbytes, last, unsaved, 3 + i // 3, live, saved=last == n))
    m = _module(ops)
    most = {3: float(rng.integers(900, 1300)), 4: float(rng.integers(900, 1500))}
    groups = op_groups(m.ops)
    classes = group_classes(groups, group_signatures(m, group_classes(groups).groups))
    rows = forward_rows(m, classes, most)
    free = [q for q in range(len(classes.members))]
    for counts in itertools.product(*(range(len(classes.members[q]) + 1) for q in free)):
        recomputed = np.array(counts, dtype=np.int64)
        save = classes.save_list(classes.multiplicity - recomputed)
        excess = forward_excess_bytes(m, save, most)
        if rows is None:  # no op can go above its moment, whatever is saved
            assert excess == {}
            continue
        need = rows.const - recomputed @ rows.class_weights
        for key in (3, 4):
            at = rows.keys == key
            row = float(need[at].max()) if at.any() else 0.0
            assert max(row, 0.0) == pytest.approx(excess.get(key, 0.0))

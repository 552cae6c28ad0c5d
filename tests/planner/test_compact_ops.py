"""Ops made without a pydantic call each (planner.stats.op_format.CompactOps): the same ops, refusals and text.

The known answers are pydantic's own: every value the compact path accepts must
be what ``OpStats.model_validate`` makes of it, and whatever it declines must be
left to that validation (which converts it or words the error as before).
"""

import copy
import json
import math
import random
from pathlib import Path

import pytest
from pydantic import ValidationError

from planner import OpStats, parse_stats
from planner.stats.op_format import OP_FIELDS, CompactOps, with_runtime

DATA = Path(__file__).resolve().parents[1] / "data"
EXAMPLE = Path(__file__).resolve().parents[2] / "service" / "example_stats.json"

# Each field's edge cases: accepted ones, ones pydantic converts (1 -> 1.0, 12.0 -> 12), ones it refuses.
VALUES = {
    "name": ["aten.mm", "a", "x" * 512, "x" * 513, "", "\ud800", "é", 5, None, True],
    "runtime_ms": [0.0, -0.0, 0.5, 1e12, 1e12 + 1e-3, 1, 0, 10**12, 10**12 + 1, -1e-9, math.nan, math.inf,
                   True, "1.5", None],
    "output_bytes": [0, 12, 2**62, 2**62 + 1, -1, 12.0, 12.5, True, "12", None],
    "view_like": [False, True, 0, 1, "true", None],
    "random": [False, True, 1],
    "inplace_parent": [None, 0, 3, -1, 2.0, True, "1"],
    "saved_by_autograd": [False, True, 0],
}


def _pydantic(fields: dict):
    try:
        return OpStats.model_validate(fields)
    except ValidationError:
        return None


def _same(compact: OpStats, validated: OpStats) -> bool:
    a, b = compact.model_dump(), validated.model_dump()
    return a == b and all(type(a[k]) is type(b[k]) for k in a) and compact == validated and (
        json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True))


def test_compact_ops_are_the_ops_pydantic_makes_or_are_left_to_it():
    rng = random.Random(33)
    base = {"name": "aten.mm", "runtime_ms": 0.5, "output_bytes": 12, "view_like": False, "random": False,
            "inplace_parent": None, "saved_by_autograd": False}
    cases = [{**base, field: v} for field, values in VALUES.items() for v in values]  # one edge at a time
    cases += [{f: rng.choice(VALUES[f]) for f in OP_FIELDS} for _ in range(3000)]  # and random mixes
    maker = CompactOps()
    made = 0
    for fields in cases:
        validated = _pydantic(fields)
        compact = maker.op(*(fields[f] for f in OP_FIELDS))
        if compact is not None:
            made += 1
            assert validated is not None and _same(compact, validated), fields
        from_json = maker.from_json(dict(fields))
        if isinstance(from_json, OpStats):
            assert validated is not None and _same(from_json, validated), fields
        else:
            assert from_json == fields  # left as it came, for the model
    assert made >= 30  # the common case does take the compact path


def test_an_op_priced_anew_is_pydantics_copy():
    # with_runtime stands in for op.model_copy(update={"runtime_ms": ...}) when a plan prices ops anew: the same
    # op, fields given and dump, the original untouched, for compact ops and validated ones with every field
    maker = CompactOps()
    ops = [maker.op("aten.mm", 0.5, 12, False, True, None, True),
           OpStats(name="aten.add_", runtime_ms=2.0, output_bytes=8, inplace_parent=0, must_save=True,
                   held_tensors=[3], storages=[(8, 1, True)])]
    for op in ops:
        before = op.model_dump()
        ours, theirs = with_runtime(op, 0.25), op.model_copy(update={"runtime_ms": 0.25})
        assert _same(ours, theirs) and ours.model_fields_set == theirs.model_fields_set
        assert ours.model_dump_json(exclude_unset=True) == theirs.model_dump_json(exclude_unset=True)
        assert op.model_dump() == before and op.runtime_ms != 0.25


@pytest.mark.parametrize("given", [{}, {"view_like": True}, {"storages": None}, {"held_tensors": [3]},
                                   {"extra": 1}])
def test_json_ops_keep_the_fields_they_gave(given):
    op = {"name": "aten.mm", "runtime_ms": 0.5, "output_bytes": 12, **given}
    made = CompactOps().from_json(op)
    if set(given) <= set(OP_FIELDS):
        assert isinstance(made, OpStats) and made.model_fields_set == set(op)
        copied = made.model_copy(update={"runtime_ms": 0.25})  # as recompute_ops prices them: a set of its own
        assert copied.runtime_ms == 0.25 and made.runtime_ms == 0.5 and made.model_fields_set == set(op)
    else:
        assert made is op  # validated by the model: held_tensors, storages, unknown fields


def _documents():
    yield "L12 (PyTorch's format)", json.loads((DATA / "torch_format_transformer_L12.json").read_text())
    yield "the service's example (v1, a timeline)", json.loads(EXAMPLE.read_text())
    doc = json.loads(EXAMPLE.read_text())
    ops = next(m for m in doc["modules"] if m.get("ops"))["ops"]
    ops[0] = {**ops[0], "storages": [[64, 1, True]], "name": "aten.\u00e9\u4e2d", "runtime_ms": 3}
    yield "v1 with storages, a non-ASCII name and an int runtime", doc


@pytest.mark.parametrize("name,doc", list(_documents()), ids=lambda v: v if isinstance(v, str) else "")
def test_canonical_text_is_the_whole_dump_sorted(name, doc):
    # The text (and so the hash, a stored upload's identity) is what it was when canonical_json dumped the
    # whole model at once: written a module at a time now.
    stats = parse_stats(copy.deepcopy(doc))
    whole = json.dumps(stats.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    assert stats.canonical_json() == whole == "".join(stats.canonical_json_parts())
    assert parse_stats(json.loads(whole)).canonical_json() == whole


def test_repeated_op_lists_are_each_checked():
    # The consistency check runs once per distinct op list: a list contradicting the SAC rules is refused where
    # it is, after lists like it passed. (An in-place op on a view-like parent that is its own parent: saved
    # and recomputed at once.)
    doc = json.loads(EXAMPLE.read_text())
    with_ops = [k for k, m in enumerate(doc["modules"]) if m.get("ops")]
    assert len(with_ops) >= 2
    last = with_ops[-1]
    ops = doc["modules"][last]["ops"]
    ops[0] = {**ops[0], "view_like": True, "inplace_parent": 0}
    with pytest.raises(ValueError, match=rf"modules\[{last}\]\.ops: contradictory SAC rules"):
        parse_stats(doc)

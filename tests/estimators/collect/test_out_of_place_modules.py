"""Modules run outside the module their name places them in: collected without them, parents still exact.

Stats v1 nests modules by fqn; these models (``out_of_place_models.py``) run
some module elsewhere. The collector leaves such a module out and names it;
the module it ran inside keeps its ops and bytes, so checkpointing that one
applies by position and frees what the stats say.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import out_of_place_models as shapes  # noqa: E402
from estimators import RooflineCostModel, apply_plan, collect_stats, device_spec  # noqa: E402
from estimators.collect import LEFT_OUT_TAG  # noqa: E402
from est_helpers import live_activation_bytes  # noqa: E402
from planner import optimal_op_policy  # noqa: E402
from planner.cli import main  # noqa: E402

MODELS = Path(shapes.__file__)
TOLERANCE = 0.02  # as the fidelity tests

# factory -> (modules left out with why, the module they ran inside: the one checkpointed below)
SHAPES = {
    "out_of_parent": ({"OutOfParent.enc.head": "ran outside OutOfParent.enc",  # a non-leaf: its submodules go too
                       "OutOfParent.enc.head.fc1": "ran outside OutOfParent.enc",
                       "OutOfParent.enc.head.fc2": "ran outside OutOfParent.enc"}, "OutOfParent"),
    "tied": ({"Tied.shared": "ran inside Tied.enc"}, "Tied.enc"),
    "sibling_call": ({"SiblingCall.norm": "ran inside SiblingCall.dec"}, "SiblingCall.dec"),
    # first run during the gate's second call, which the stats do not describe
    "two_calls": ({"TwoCalls.gate.fc": "ran outside TwoCalls.gate"}, "TwoCalls"),
}


def _collect(factory: str):
    torch.manual_seed(0)
    model, inputs = getattr(shapes, factory)(batch_size=2, seq_len=16, device="cpu")
    stats = collect_stats(model, inputs, optimizer="adamw", device="cpu",
                          cost_model=RooflineCostModel(device_spec("cpu")))
    return model, inputs, stats


@pytest.mark.parametrize("factory", SHAPES)
def test_out_of_place_modules_are_left_out_and_named(factory):
    _, _, stats = _collect(factory)
    left_out, _ = SHAPES[factory]
    assert not set(left_out) & set(stats.fw_pre_order)
    assert stats.metadata.tags[LEFT_OUT_TAG] == "; ".join(f"{f} ({why})" for f, why in left_out.items())


@pytest.mark.parametrize("factory", ["tied", "sibling_call"])
def test_module_the_left_out_one_ran_inside_checkpoints_as_predicted(factory):
    """Its op list holds the left-out module's ops (apply checks them by name), and its IA their bytes."""
    model, inputs, stats = _collect(factory)
    fqn = SHAPES[factory][1]
    m = stats.module(fqn)
    save = optimal_op_policy(m.ops, 0.0)
    discarded = m.act_saved_bytes - sum(op.output_bytes for op, s in zip(m.ops, save) if s)
    assert discarded > 0
    plan = {"status": "optimal", "modules": [{"fqn": fqn, "discard_ratio": 1.0, "discarded_bytes": discarded,
                                              "saved_bytes": 0, "recompute_ms": 0.0, "save": save}]}
    planned = apply_plan(copy.deepcopy(model), plan, stats=stats)
    # freed bytes, not kept ones: live_activation_bytes counts a view of a float input as created by the call
    kept, out = live_activation_bytes(planned, lambda: planned(*inputs))
    out.sum().backward()
    kept_without_plan, out = live_activation_bytes(model, lambda: model(*inputs))
    out.sum().backward()

    freed = kept_without_plan - kept
    assert abs(freed - discarded) <= TOLERANCE * discarded, (freed, discarded)
    for (name, p), q in zip(model.named_parameters(), planned.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0, msg=f"gradient of {name}")


def test_parent_of_module_run_from_outside_checkpoints_without_it():
    """OutOfParent.enc's op list is its own forward only: the head the model ran before it is not in it."""
    model, inputs, stats = _collect("out_of_parent")
    ops = stats.module("OutOfParent.enc").ops
    plan = {"status": "optimal", "modules": [{"fqn": "OutOfParent.enc", "discard_ratio": 1.0, "discarded_bytes": 0,
                                              "saved_bytes": 0, "recompute_ms": 0.0,
                                              "save": optimal_op_policy(ops, 0.0)}]}
    planned = apply_plan(copy.deepcopy(model), plan, stats=stats)
    planned(*inputs).sum().backward()  # PlanMismatchError if the head's ops had been counted in


def test_collect_cli_names_left_out_modules(tmp_path, capsys):
    out = tmp_path / "stats.json"
    rc = main(["collect", "--model", f"{MODELS}:sibling_call", "--batch", "2", "--seq", "16", "--out", str(out),
               "--quiet"])
    assert rc == 0
    assert "left out" in capsys.readouterr().out and "SiblingCall.norm (ran inside SiblingCall.dec)" in out.read_text()


def test_invalid_collected_stats_are_one_clear_line(tmp_path, capsys, monkeypatch):
    """Were a module kept out of place, the error names it and its parent, with no pydantic dump."""
    import estimators.collect.assemble

    monkeypatch.setattr(estimators.collect.assemble, "modules_out_of_place", lambda *_: {})
    rc = main(["collect", "--model", f"{MODELS}:out_of_parent", "--batch", "2", "--seq", "16",
               "--out", str(tmp_path / "s.json"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 1 and not (tmp_path / "s.json").exists()
    assert "'OutOfParent.enc.head' does not lie inside its parent 'OutOfParent.enc'" in err
    assert "collector bug" in err and "pydantic" not in err and "input_value" not in err


def test_apply_refuses_a_plan_for_a_left_out_module():
    from estimators import PlanMismatchError

    model, _, stats = _collect("tied")
    plan = {"status": "optimal", "modules": [{"fqn": "Tied.shared", "save": [0], "op_names": ["aten.embedding"]}]}
    with pytest.raises(PlanMismatchError, match=r"'Tied.shared' has no op list in the stats .*modules_left_out"):
        apply_plan(model, plan, stats=stats)

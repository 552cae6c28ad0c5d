"""Offloading's model (issue 31) on the hand-built 3-block toy of ``offload_toy`` (its figures are in its
docstring): the windows, the credit key rule, the stall formula, which groups may go to host memory, and the
options. Every expected number below is worked out by hand from the toy and the rules of
``planner/solve/offload.py``'s docstring (windows, B_{j+1} = end position of window j+1 + 1, the stall
formula)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from offload_toy import toy_doc, toy_stats

from planner import PlanOptions, parse_stats, plan, stats_hash
from planner.solve.offload import (check_offloads, decisions, host_link, offload_options, offload_setup,
                                   offload_windows)
from planner.solve.problem import prepare
from planner.stats.metadata import HostLink

L4 = Path(__file__).resolve().parents[1] / "data" / "torch_format_transformer_L4.json"


def _windows(stats, gbps=None):
    prob = prepare(stats)
    return prob, offload_windows(prob, host_link(stats, gbps))


def test_windows_of_the_toy():
    prob, w = _windows(toy_stats(), 1.0)
    assert w.end_modules == ("R.layers.0", "R.layers.1", "R.layers.2", "")
    assert w.end_pos.tolist() == [2, 4, 6, 9]
    # B_{j+1}: window 1 ends at R.layers.1 (position 4): key 5; window 2 at 6: key 7; the last at the root: 10
    assert w.credit_key.tolist() == [5, 7, 10, -1]
    assert w.candidate_window.tolist() == [0, 1, 2]
    # window 0: block 0 (2 ms) + R.emb before it (0.5 ms); the last: R's 7.5 less 2.5 + 2 + 2 = 1 ms (bw: 14.5 - 12.5)
    assert w.forward_ms.tolist() == [2.5, 2.0, 2.0, 1.0]
    assert w.backward_ms.tolist() == [4.5, 4.0, 4.0, 2.0]
    assert w.hidden_ms(0) == (2.0, 4.0) and w.hidden_ms(2) == (1.0, 2.0) and w.hidden_ms(3) == (0.0, 0.0)


def test_offload_is_credited_exactly_from_the_next_windows_end_in_both_phases():
    prob, w = _windows(toy_stats(), 1.0)
    model = prob.model
    base = model.profile_bytes()
    credit = w.credits([300, 0, 0, 0])
    assert credit == {5: 300.0}
    got = model.profile_bytes(offloaded=credit)
    for phase in ("forward", "backward"):
        at = np.array([p == phase for p in model.phases])
        for key in range(11):
            t = np.flatnonzero(at & (model.keys == key))[0]
            assert base[t] - got[t] == (300 if key >= 5 else 0), (phase, key)  # not at key 4 = B_1 - 1
    # window 2 (the last block) is credited only at key 10: after the root's forward, before any backward
    got = model.profile_bytes(offloaded=w.credits([0, 0, 50, 0]))
    assert [int(k) for k in model.keys[base - got == 50]] == [10, 10]


def test_the_last_window_is_never_credited_and_offers_nothing():
    prob, w = _windows(toy_stats(), 1.0)
    with pytest.raises(ValueError, match="window 3 is the last window"):
        w.credits([0, 0, 0, 10])
    # a candidate in the last window: checkpoint R.layers as a whole (it ends after the last block)
    doc = toy_doc()
    doc["modules"][2]["ops"] = [dict(name="aten.mm", runtime_ms=1.0, output_bytes=500, saved_by_autograd=True)]
    doc["modules"][2]["act_saved_bytes"] = 12_500
    stats = parse_stats(doc)
    prob, w = _windows(stats, 1.0)
    i = [c.fqn for c in prob.candidates].index("R.layers")
    assert w.candidate_window[i] == 3 and i not in offload_options(prob, w)


def test_stall_at_zero_at_the_capacity_edge_and_one_byte_over_in_both_directions():
    stats = toy_stats(host_link_gbps=dict(d2h=1.0, h2d=0.25, source="toy"))
    _, w = _windows(stats)
    assert (w.link.d2h_bytes_per_ms, w.link.h2d_bytes_per_ms) == (1e6, 2.5e5)
    # window 0's copies hide behind window 1: 2 ms forward (2e6 B at 1 GB/s), 4 ms backward (1e6 B at 0.25 GB/s)
    assert w.stall_ms(0, 0) == 0.0
    assert w.stall_ms(0, 1_000_000) == 0.0  # back: exactly 4 ms
    assert w.stall_ms(0, 1_000_001) == pytest.approx(4e-6, abs=1e-12)  # back: 1 byte over, 1 / 2.5e5 ms
    assert w.stall_ms(0, 2_000_000) == pytest.approx(4.0)  # to host: exactly 2 ms; back: 8 - 4
    assert w.stall_ms(0, 2_000_001) == pytest.approx(1e-6 + 4.000004, abs=1e-12)  # both directions over


def test_which_groups_may_be_offloaded():
    prob, w = _windows(toy_stats(), 1.0)
    opts = offload_options(prob, w)
    # classes (by bytes, ms): mm, silu, mul; the view is never free. Block 0's mul makes a tensor block 1 holds.
    assert [o.groups for o in (opts[0], opts[1], opts[2])] == [((0,), (2,), ()), ((0,), (2,), (3,)),
                                                               ((0,), (2,), (3,))]
    doc = toy_doc()
    doc["modules"][5]["calls"] = 2  # R.layers.1 called twice: no offload for it
    prob = prepare(parse_stats(doc))
    assert sorted(offload_options(prob, offload_windows(prob, host_link(prob.stats, 1.0)))) == [0, 2]


def test_decisions_put_counts_on_groups():
    prob, w = _windows(toy_stats(), 1.0)
    cand, opts = prob.candidates[0], offload_options(prob, w)[0]
    save, off = decisions(cand.classes, opts, np.array([0, 0, 1]), np.array([1, 1, 0]))
    assert save == [1, 0, 1, 0] and off == [1, 0, 1, 0]
    with pytest.raises(ValueError, match="class 2: 0 recomputed and 1 offloaded"):
        decisions(cand.classes, opts, np.array([0, 0, 0]), np.array([0, 0, 1]))  # block 0's mul is held


def test_host_link_comes_from_the_option_over_the_stats_and_is_required():
    stats = toy_stats(host_link_gbps=dict(d2h=290.0, h2d=340.0, source="GH200 NVLink-C2C"))
    assert (host_link(stats, None).d2h_gbps, host_link(stats, None).h2d_gbps) == (290.0, 340.0)
    assert host_link(stats, 24.0).d2h_gbps == host_link(stats, 24.0).h2d_gbps == 24.0
    with pytest.raises(ValueError, match=r"^host_link_gbps is needed with offload 'on': the stats carry no host link figure \(target not "):
        host_link(toy_stats(), None)
    with pytest.raises(ValueError, match="host_link_gbps"):
        plan(toy_stats(), 1e-5, offload="on")


def test_offload_refuses_stats_its_windows_do_not_cover():
    with pytest.raises(ValueError, match=r"^offload 'on' needs stats with a timeline"):
        plan(L4, 4.0, offload="on", host_link_gbps=24)  # PyTorch's format: no timeline
    stage = dict(stage=0, stages=2, schedule="1f1b", microbatches=2, held_bytes=0, buffer_bytes=0)
    with pytest.raises(ValueError, match=r"^offload 'on' is not supported for a pipeline stage's stats"):
        plan(toy_stats(pipeline=stage), 1.0, offload="on", host_link_gbps=24)


@pytest.mark.parametrize("value,match", [
    ("of", "offload must be 'off' or 'on', got 'of'"),
    (True, "offload must be 'off' or 'on', got True"),
])
def test_offload_option_errors(value, match):
    with pytest.raises(ValueError, match=match):
        plan(toy_stats(), 1.0, offload=value)


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), "24", True, 1e-7])
def test_host_link_option_errors(value):
    with pytest.raises(ValueError, match=r"^host_link_gbps must be a positive number of GB/s \(at least 1e-06\), "
                                         f"got {value!r}$"):
        plan(toy_stats(), 1.0, offload="on", host_link_gbps=value)


def test_cache_key_leaves_offload_out_when_off():
    off = PlanOptions().cache_fields()
    assert "offload" not in off and "host_link_gbps" not in off
    assert PlanOptions(host_link_gbps=24).cache_fields() == off  # an unused bandwidth changes no off plan
    on = PlanOptions(offload="on", host_link_gbps=24).cache_fields()
    assert on["offload"] == "on" and on["host_link_gbps"] == 24.0 and isinstance(on["host_link_gbps"], float)


def test_an_old_stats_documents_hash_is_unchanged_and_the_link_round_trips():
    # computed with main at 625d5f7, before the host_link_gbps field existed
    assert stats_hash(toy_stats()) == "06a493742d75188aacfbbe19082084c8c76f6898e01b9acf8181921566490f24"
    stats = toy_stats(host_link_gbps=dict(d2h=24.0, h2d=24, source="PCIe Gen4 x16"))
    assert parse_stats(stats.model_dump(mode="json")).metadata.host_link_gbps == HostLink(d2h=24.0, h2d=24,
                                                                                          source="PCIe Gen4 x16")
    with pytest.raises(ValueError, match="d2h"):
        toy_stats(host_link_gbps=dict(d2h=0, h2d=1.0, source="x"))


def test_held_inputs_in_a_modules_own_backward_are_not_offset_by_offload():
    # R.layers.1 (post 4) holds 1000 B of inputs through its backward (keys 3..4); window 0's offload is credited
    # from key 5 on, so those moments see the held inputs in full, and the same credit elsewhere
    prob, w = _windows(toy_stats(), 1.0)
    model = prob.model
    with_held = model.profile_bytes({"R.layers.1": 500.0})
    both = model.profile_bytes({"R.layers.1": 500.0}, offloaded=w.credits([300, 0, 0, 0]))
    backward = np.array([p == "backward" for p in model.phases])
    own = backward & (model.keys >= 3) & (model.keys <= 4)
    assert (with_held - model.profile_bytes() == 1000)[own].all()  # held in full, the discard not in effect
    assert (both == with_held)[own].all() and (with_held - both)[model.keys >= 5].tolist() == [300.0] * 12


def test_a_plans_offload_list_must_offload_saved_ops():
    from planner.plan_format import PlannedModule

    kw = dict(fqn="m", discard_ratio=0.5, discarded_bytes=1, saved_bytes=1, recompute_ms=0.0, save=[1, 0])
    assert PlannedModule(**kw, offload=[1, 0]).offload == [1, 0]
    with pytest.raises(ValueError, match=r"offload\[1\] of 'm' is 1: 0, or 1 where save\[1\] is 1 \(save\[1\] is 0\)"):
        PlannedModule(**kw, offload=[0, 1])
    with pytest.raises(ValueError, match="offload of 'm' has 1 entries, save 2"):
        PlannedModule(**kw, offload=[0])


def test_check_offloads_names_what_the_model_does_not_allow():
    stats = toy_stats()
    prob = prepare(stats)
    setup = offload_setup(prob, host_link(stats, 1.0))
    save = {"R.layers.0": [1, 0, 1, 1]}
    check_offloads(prob, setup, save, {"R.layers.0": [1, 0, 1, 0]})  # mm and silu: allowed
    with pytest.raises(ValueError, match="'R.layers.1' offloads, but it is not a checkpointed module"):
        check_offloads(prob, setup, save, {"R.layers.1": [1, 0, 0, 0]})
    with pytest.raises(ValueError, match="'R.layers.0' offloads op 1, which it does not save"):
        check_offloads(prob, setup, save, {"R.layers.0": [0, 1, 0, 0]})
    with pytest.raises(ValueError, match=r"offloads op group 3 \(ops \[3\]\), which may not be offloaded"):
        check_offloads(prob, setup, save, {"R.layers.0": [0, 0, 0, 1]})  # its mul makes block 1's held input

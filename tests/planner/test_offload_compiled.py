"""Offloading with stats of a compiled step: no op is offloaded that the compiled backward would not read.

Under ``aot_eager`` the partitioner saves an op's output only where the backward reads it: a storage the
module's forward saves, or the input of a taker it recomputes (``compiled_takers``). An op whose takers the
plan saves or offloads is read by no backward: offloaded, its host copy would be made and let go unread
(bench/RESULTS.md, "Real CPU steps under torch.compile": at 65% the compiled backward read 32 of 71 copies).
"""

from __future__ import annotations

import pytest
from offload_toy import toy_doc

from planner import GIB, Stats, plan
from planner.solve.offload_solve import unread_ops
from planner.stats.op_format import OpStats


def _ops(saved_flags: list[bool], takers: list[list[int] | None]) -> list[OpStats]:
    return [OpStats(name="aten.mul", runtime_ms=1.0, output_bytes=8, saved_by_autograd=s, compiled_takers=t)
            for s, t in zip(saved_flags, takers)]


def test_an_op_is_read_when_saved_or_when_a_recomputed_reader_is_read():
    # a chain 0 -> 1 -> 2, only 2's output saved for the backward (as q_proj's mm -> rotary mul -> add)
    ops = _ops([False, False, True], [[1], [2], []])
    assert unread_ops(ops, [1, 1, 1]) == {0, 1}  # 2 saved: neither 1 nor 0 is recomputed from
    assert unread_ops(ops, [1, 0, 1]) == {0, 1}  # 1 recomputed, but nothing reads it: nor its input
    assert unread_ops(ops, [1, 1, 0]) == {0}  # 2 recomputed: 1 is read, 0 is not (1 saved) ...
    assert unread_ops(ops, [0, 0, 0]) == set()  # ... and with 1 recomputed too, 0 is read
    # 0 taken by 2 directly as well: read whenever 2 is recomputed
    assert unread_ops(_ops([False, False, True], [[1, 2], [2], []]), [1, 1, 0]) == set()
    assert unread_ops(_ops([False, False, True], [[1, 2], [2], []]), [1, 1, 1]) == {0, 1}
    # eager stats (no takers known): every op counts as read
    assert unread_ops(_ops([False, False, True], [None, [2], []]), [1, 1, 1]) == set()


def _toy(compiled: bool) -> Stats:
    """The offload toy, its blocks' mm read by no backward of its own: only its silu (through the view) takes
    it, and it is not saved for the backward (a compiled step's stats say so with ``compiled_takers``)."""
    doc = toy_doc()
    for m in doc["modules"]:
        for k, op in enumerate(m.get("ops") or ()):
            op["saved_by_autograd"] = k != 0
            if compiled:
                op["compiled_takers"] = {0: [2], 2: [3]}.get(k, [])
    return Stats.model_validate(doc)


def test_a_plan_recomputes_an_op_it_would_offload_that_no_compiled_backward_reads():
    # without the takers (eager stats) the toy's 20_500 B plan offloads block 0's mm (its silu and mul saved)
    eager = plan(_toy(False), 20_500 / GIB, offload="on", host_link_gbps=24)
    assert eager.status == "optimal" and eager.host_bytes == 1000
    assert [(m.fqn, m.save, m.offload) for m in eager.modules][0] == ("R.layers.0", [1, 0, 1, 1], [1, 0, 0, 0])
    # compiled: the silu that takes it is saved, so no backward reads the mm: recomputed, nothing on the host
    compiled = plan(_toy(True), 20_500 / GIB, offload="on", host_link_gbps=24)
    assert compiled.status == "optimal" and compiled.host_bytes == 0
    layer0 = next(m for m in compiled.modules if m.fqn == "R.layers.0")
    assert layer0.save[0] == 0 and not any(layer0.offload or ())
    # it frees the mm at the block's forward end instead of at the next window's end: the peak cannot rise
    assert compiled.peak_bytes <= eager.peak_bytes <= 20_500
    # counted as recomputed (1 ms a block), as every op a plan does not save is; nothing runs it
    assert compiled.recompute_ms == pytest.approx(eager.recompute_ms + 2.0)


def test_compiled_takers_out_of_range_are_refused():
    doc = toy_doc()
    doc["modules"][3]["ops"][2]["compiled_takers"] = [1]
    with pytest.raises(ValueError, match=r"ops\[2\].compiled_takers: 1 is not a later op of the 4"):
        Stats.model_validate(doc)

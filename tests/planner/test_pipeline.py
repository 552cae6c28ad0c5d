"""A pipeline stage's memory along its schedule, and every stage planned under one budget (issue 30)."""

from __future__ import annotations

import copy

import pytest

import planner
from planner import parse_stats
from planner.pipeline_schedule import in_flight, stage_events


@pytest.mark.parametrize("stages, microbatches", [(4, 8), (4, 2), (2, 4), (8, 8)])
def test_1f1b_holds_stages_minus_stage_microbatches_and_gpipe_all(stages, microbatches):
    # 1F1B (PipeDream-Flush, Narayanan et al., SC'21, sec. 2.2; PyTorch's Schedule1F1B: "first stage
    # num_stages warmups"): stage s runs min(M, S - s) forwards before its first backward, then one of each.
    # GPipe (Huang et al., NeurIPS'19): every forward before any backward.
    for s in range(stages):
        assert in_flight("1f1b", s, stages, microbatches) == min(microbatches, stages - s)
        assert in_flight("gpipe", s, stages, microbatches) == microbatches
        events = stage_events("1f1b", s, stages, microbatches)
        assert sorted((e.phase, e.microbatch) for e in events) == sorted(
            [("forward", j) for j in range(1, microbatches + 1)] + [("backward", j) for j in range(1, microbatches + 1)])


def _doc(stage: int, stages: int = 2, microbatches: int = 3) -> dict:
    """tests/planner/test_grad_accumulation.py's two micro-batches (a block discarding 500 bytes; key 1 forward,
    key 2 backward; the second holds 300 bytes of the first one's gradients) as one pipeline stage."""
    ops = [{"name": "aten.mm", "runtime_ms": 1.0, "output_bytes": 500, "saved_by_autograd": True}]
    timeline = []
    for k in (1, 2):
        grads = 0 if k == 1 else 300
        timeline += [{"phase": "forward", "key": 1, "activation_bytes": 700, "grad_bytes": grads, "micro_batch": k},
                     {"phase": "backward", "key": 2, "activation_bytes": 800, "grad_bytes": grads + 100,
                      "micro_batch": k}]
    timeline.append({"phase": "optimizer", "key": 0, "activation_bytes": 100, "grad_bytes": 300,
                     "optimizer_bytes": 50})
    return {
        "metadata": {"model_name": "tiny", "grad_accumulation": 2,
                     "pipeline": {"stage": stage, "stages": stages, "schedule": "1f1b", "microbatches": microbatches,
                                  "held_bytes": 600, "buffer_bytes": 10, "input_grad_bytes": 0}},
        "fw_pre_order": ["M", "M.block", "M.head"],
        "fw_post_order": ["M.block", "M.head", "M"],
        "modules": [
            {"fqn": "M", "parent": None, "is_leaf": False, "param_bytes": 1000, "output_bytes": 50},
            {"fqn": "M.block", "parent": "M", "is_leaf": False, "act_saved_bytes": 500, "ops": ops},
            {"fqn": "M.head", "parent": "M", "is_leaf": True},
        ],
        "timeline": timeline,
    }


def test_the_first_stage_holds_a_second_microbatch_and_its_discard():
    stats = parse_stats(_doc(0))
    # stage 0 of 2, 3 microbatches: F1 F2 B1 F3 B2 B3. Each moment: activations + 1000 parameters + gradients,
    # + 600 per other microbatch held, + 2 x 10 of the other microbatches' buffers, + 50 (microbatch 1's output,
    # which the warmup's last send keeps from B1 to the end of the steady phase: F3, B2). B2 (microbatch 2's
    # backward, one held): 800 + 1000 + 400 + 600 + 20 + 50 = 2870.
    assert planner.baseline_peak_bytes(stats) == 2870
    plan = planner.plan(stats, 1900 / planner.GIB)
    # the block checkpointed discards 500 for the running microbatch and 500 for the held one: B2 1870
    assert plan.status == "optimal" and [m.fqn for m in plan.modules] == ["M.block"]
    assert plan.peak_bytes == 1870 and plan.peak_micro_batch == 2
    assert plan.grad_accumulation == 3 and plan.recompute_ms_per_optimizer_step == pytest.approx(3.0)


def test_the_last_stage_holds_one_microbatch():
    # F1 B1 F2 B2 F3 B3, nothing held: B2 and B3 800 + 1000 + 400 + 20 = 2220
    assert planner.baseline_peak_bytes(parse_stats(_doc(1))) == 2220


def test_every_stage_planned_under_one_budget():
    docs = [_doc(1), _doc(0)]  # any order
    pp = planner.plan_pipeline(docs, 1900 / planner.GIB)
    assert pp.status == "optimal" and [p.peak_bytes for p in pp.stages] == [1870, 1720]
    assert pp.in_flight == [2, 1]
    # each stage's microbatch: no forward/backward time in the document, 1 ms of recompute; GPipe/1F1B's step:
    # sum over the stages + (M - 1) x the slowest = 2 + 2 x 1 (docs/pipeline.md)
    assert pp.stage_ms == [pytest.approx(1.0)] * 2 and pp.step_ms == pytest.approx(4.0)
    short = planner.plan_pipeline(docs, 1000 / planner.GIB)
    assert short.status == "infeasible" and short.infeasible_stage == 0
    assert short.min_feasible_budget_gib == max(p.min_feasible_budget_gib for p in short.stages)
    assert "stage 0 has no plan" in short.message


@pytest.mark.parametrize("docs, match", [
    ([_doc(0), _doc(0)], r"stages \[0, 0\]; a 2-stage pipeline needs each of \[0, 1\] once"),
    ([_doc(0), _doc(1, microbatches=4)], r"stats\[1\] pipeline.microbatches 4 differs from stats\[0\]'s 3"),
])
def test_stages_of_one_pipeline_are_checked(docs, match):
    with pytest.raises(ValueError, match=match):
        planner.plan_pipeline(docs, 1.0)


def test_a_document_without_a_pipeline_is_refused_and_keeps_its_fields():
    plain = copy.deepcopy(_doc(0))
    del plain["metadata"]["pipeline"]
    assert "pipeline" not in parse_stats(plain).model_dump(mode="json")["metadata"]
    with pytest.raises(ValueError, match=r"stats\[0\] is not a pipeline stage's"):
        planner.plan_pipeline([plain, _doc(1)], 1.0)
    bad = _doc(0)
    bad["metadata"]["pipeline"]["stage"] = 2
    with pytest.raises(ValueError, match="pipeline.stage 2 is out of range for 2 stages"):
        parse_stats(bad)


def test_interleaved_stage_info_needs_one_chunk_entry_per_virtual_stage():
    from planner.stats.pipeline import PipelineChunkInfo, PipelineStageInfo

    base = dict(stage=0, stages=2, microbatches=4, held_bytes=1, buffer_bytes=1)
    chunk = PipelineChunkInfo(stage_index=0, modules=["M.model.layers.0"], held_bytes=1, output_bytes=1)
    with pytest.raises(ValueError, match="pipeline.chunks must be given exactly for interleaved-1f1b"):
        PipelineStageInfo(schedule="interleaved-1f1b", virtual_stages=2, **base)
    with pytest.raises(ValueError, match="pipeline.chunks has 1 entries for virtual_stages 2"):
        PipelineStageInfo(schedule="interleaved-1f1b", virtual_stages=2, chunks=[chunk], **base)
    assert "chunks" not in PipelineStageInfo(schedule="1f1b", **base).model_dump()  # absent: stored ids unchanged


def test_the_split_dynamic_program_finds_the_split_enumeration_finds():
    import itertools

    from planner.pipeline_split import best_split

    # stage k of a run of layers: its layers (weights 1..7) plus a position cost, the first stage over a cap
    weights = [3.0, 1.0, 4.0, 1.0, 5.0, 2.0, 6.0]
    fixed = [2.0, 0.0, 3.0]

    def stage_ms(k, a, b):
        ms = fixed[k] + sum(weights[a:b])
        return None if k == 0 and b - a > 3 else ms

    def step(starts):
        ends = list(starts[1:]) + [len(weights)]
        times = [stage_ms(k, a, b) for k, (a, b) in enumerate(zip(starts, ends))]
        return None if None in times else planner.pipeline_step_ms(times, 4)

    every = [s for cut in itertools.combinations(range(1, len(weights)), 2)
             if (s := step((0, *cut))) is not None]
    starts, times = best_split(stage_ms, 3, len(weights), 4)
    assert planner.pipeline_step_ms(times, 4) == pytest.approx(min(every)) == pytest.approx(step(starts))

"""Interleaved 1F1B's order per rank, against the schedule PyTorch runs, and its in-flight counts (issue 30)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B, _ComputationType  # noqa: E402

from planner.pipeline_interleaved import interleaved_in_flight, interleaved_order  # noqa: E402

CASES = [(2, 2, 4), (2, 2, 8), (4, 2, 8), (4, 3, 4), (2, 3, 6), (4, 2, 12)]


def _torch_order(rank: int, stages: int, virtual: int, microbatches: int) -> list[tuple[int, str, int]]:
    """The compute actions ``ScheduleInterleaved1F1B`` lays out for ``rank`` (its own planning code, run on an
    instance given only the sizes it reads: no process group needed), as (local chunk, phase, microbatch)."""
    sched = object.__new__(ScheduleInterleaved1F1B)
    sched.n_local_stages, sched.pp_group_size, sched._n_microbatches = virtual, stages, microbatches
    sched.number_of_rounds = max(1, microbatches // stages)
    sched.microbatches_per_round = microbatches // sched.number_of_rounds
    return [((a.stage_index - rank) // stages,
             "forward" if a.computation_type == _ComputationType.FORWARD else "backward", a.microbatch_index + 1)
            for a in sched._calculate_single_rank_operations(rank) if a is not None]


@pytest.mark.parametrize("stages,virtual,microbatches", CASES)
def test_the_order_is_the_one_torch_runs(stages, virtual, microbatches):
    for rank in range(stages):
        assert interleaved_order(rank, stages, virtual, microbatches) == _torch_order(rank, stages, virtual,
                                                                                   microbatches)


@pytest.mark.parametrize("stages,virtual,microbatches", CASES)
def test_a_rank_holds_its_warmup_and_one_more(stages, virtual, microbatches):
    # Narayanan et al. 2021 section 2.2.2 / docs/pipeline.md: a warm-up of (V - 1) x S + 2 x (S - 1 - r) forwards
    # (M a multiple of S), no backward among them; the steady phase runs a forward before its first backward.
    for rank in range(stages):
        warmup = (virtual - 1) * stages + 2 * (stages - 1 - rank)
        assert interleaved_in_flight(rank, stages, virtual, microbatches) == min(warmup + 1, virtual * microbatches)

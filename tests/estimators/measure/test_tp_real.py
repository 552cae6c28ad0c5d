"""Real tensor-parallel training on 2 gloo ranks of this CPU against one rank's stats (issue 29, point 4).

The reduced check of ``bench/bench_tensor_parallel.py``: the tiny llama (no dropout) collected as one rank
of TP x2 under the fake process group (the model's HF plan), planned at its smallest feasible budget (both
decoder layers checkpointed whole: each ends in a row-wise all-reduce past the recompute's early stop, which
SAC holds through the layer's backward; 16 KiB over the prediction until the collector counted it),
then trained for real on 2 gloo ranks (``bench/tp_run.py``: TP, then the plan, AdamW, 2 steps). Every
rank's steady-state peak (step 2) within 1% of the prediction (measured: equal to the byte), never over
the budget, and the planned run's gradients equal to the unplanned TP run's.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

import planner  # noqa: E402
from bench.tp_run import TpRun, run_tp  # noqa: E402
from est_helpers import TINY_LLAMA  # noqa: E402
from estimators import CollectRequest, run_collection, run_ranks  # noqa: E402

LLAMA = {**TINY_LLAMA, "attention_dropout": 0.0}
BATCH, SEQ = 2, 32
GIB = 2**30


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> dict:
    if not torch.distributed.is_gloo_available():
        pytest.skip("no gloo backend in this torch build")
    stats = run_collection(CollectRequest(hf_config=LLAMA, batch=BATCH, seq=SEQ, tp_size=2)).stats
    path = tmp_path_factory.mktemp("tp") / "stats.json"
    path.write_text(json.dumps(stats.model_dump(mode="json")))
    budget = planner.min_feasible_budget_gib(stats) * GIB
    p = planner.plan(stats, budget / GIB)
    assert p.status == "optimal" and p.modules
    runs = [TpRun("base", LLAMA, BATCH, SEQ, steps=1),  # its gradients; its peaks: bench/bench_tensor_parallel.py
            TpRun("planned", LLAMA, BATCH, SEQ, plan=p.model_dump(mode="json"), stats_path=str(path), steps=2)]
    return {"ranks": run_ranks(run_tp, 2, runs), "planned": p.peak_bytes, "budget": budget}


def test_every_rank_peaks_as_predicted_within_the_budget(job: dict) -> None:
    for rank, results in enumerate(job["ranks"]):
        base, planned = results
        assert base.error is None and planned.error is None, (base.error, planned.error)
        assert abs(planned.peaks[1] - job["planned"]) <= 0.01 * job["planned"], (rank, planned.peaks, job["planned"])
        assert max(planned.peaks) <= job["budget"], (rank, planned.peaks, job["budget"])


def test_planned_gradients_equal_the_unplanned_tp_run(job: dict) -> None:
    for rank, (base, planned) in enumerate(job["ranks"]):
        assert len(base.grads) == len(planned.grads) > 0
        assert all(torch.equal(a, b) for a, b in zip(base.grads, planned.grads)), rank


def test_a_dtensor_over_an_async_collective_counts_its_data_once() -> None:
    """A sequence-parallel residual stream is a DTensor whose shard is an AsyncCollectiveTensor (the eager result of
    a row-wise layer's reduce-scatter); FSDP2's pre-forward views each unit's inputs. The measure counted each view
    again by the wrapper's placeholder storage (no data, the shard's size): FSDP2 x TP x2 with sequence parallel
    peaked one residual-stream shard, 131,072 bytes, over its prediction on every run (bench/RESULTS.md, "Tensor
    parallel"). The data is the collective's result, once."""
    import socket

    import torch.distributed as dist
    from torch import nn
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from estimators import track_live_storages

    if not dist.is_gloo_available():
        pytest.skip("no gloo backend in this torch build")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        with track_live_storages(nn.Module()) as tracker:
            shard = torch.ones(4, 64, 128)  # 131,072 bytes, booked as the op's output
            stream = DTensor.from_local(AsyncCollectiveTensor(shard), mesh, [Shard(1)], run_check=False)
            views = [stream.view(stream.shape), stream.view_as(stream)]
            assert all(isinstance(v.to_local(), AsyncCollectiveTensor) for v in views)
            assert tracker.live_bytes() == shard.nbytes == 131072, tracker.book.live
    finally:
        dist.destroy_process_group()

"""A plan from FSDP2 stats applied to a real 2-rank FSDP2 job (gloo, CPU): it shards, trains and keeps its promise.

The order is torchtitan's (plan applied, then fully_shard; docs/fsdp.md).
The known answers come from the stats: the per-rank baseline and the plan's
peak the planner predicts from the fake 2-rank collection.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.multiprocessing as mp  # noqa: E402

from estimators import RooflineCostModel, collect_stats, device_spec  # noqa: E402
from estimators.fsdp import FsdpSetup  # noqa: E402
from estimators.models import build_from_hf_config  # noqa: E402
from est_helpers import TINY_LLAMA  # noqa: E402
from fsdp_ranks import run_rank  # noqa: E402
from planner import GIB, baseline_peak_bytes, plan  # noqa: E402

WORLD = 2


def test_planned_fsdp2_job_matches_plain_grads_and_holds_its_peak(tmp_path):
    built = build_from_hf_config(TINY_LLAMA, batch_size=2, seq_len=32, dtype=torch.float32,
                                 device=torch.device("meta"))
    stats = collect_stats(built.model, built.inputs, loss_fn=built.loss_fn, fsdp=FsdpSetup(WORLD),
                          cost_model=RooflineCostModel(device_spec("cpu")))
    baseline = baseline_peak_bytes(stats)
    p = plan(stats, 0.9 * baseline / GIB)
    assert p.status == "optimal" and p.modules, p.message
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    procs = [ctx.Process(target=run_rank, args=(r, WORLD, str(tmp_path / "store"), p.model_dump(mode="json"),
                                                stats.model_dump(mode="json"), out)) for r in range(WORLD)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=300)
    assert [proc.exitcode for proc in procs] == [0] * WORLD
    results = sorted((out.get() for _ in range(WORLD)), key=lambda r: r["rank"])
    # Step 2 is the steady state the stats predict (optimizer state live). Most runs: the plain peak is the
    # baseline to the byte, the planned one the plan's peak within bytes. But gloo's worker thread may drop
    # an all-gather's buffers after FSDP2 does, now and then (seen: +147968 bytes on one rank, exactly one
    # decoder layer's gathered parameters): the allowance is one unit's gathered bytes (docs/fsdp.md).
    unit_bytes = max(stats.module(u).param_bytes * WORLD for u in stats.metadata.sharding.units[:-1])
    for r in results:
        assert r["grads_equal"], f"rank {r['rank']}: grads differ by up to {r['max_grad_diff']}"
        assert baseline <= r["plain"][1] <= baseline + unit_bytes
        assert r["planned"][1] <= p.peak_bytes + unit_bytes
        assert r["planned"][1] < r["plain"][1]

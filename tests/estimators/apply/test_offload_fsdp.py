"""A plan that offloads, applied under FSDP2 on a real 2-rank job (gloo, CPU): gradients and host bytes per rank.

As tests/estimators/apply/test_fsdp_apply.py (the plan applied, then fully_shard; the tiny Llama, collected as
2 ranks), with ``offload="on"`` and a host link fast enough never to stall (1e6 GB/s). Known answers come from
the plan: its peak and its host bytes (less the tolerated constants an eager run recomputes).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from estimators import FsdpSetup, RooflineCostModel, build_from_hf_config, collect_stats, device_spec  # noqa: E402
from estimators import run_ranks  # noqa: E402
from estimators.apply import TOLERATED_OPS  # noqa: E402
from est_helpers import TINY_LLAMA  # noqa: E402
from fsdp_ranks import run_offload_rank  # noqa: E402
from planner import GIB, baseline_peak_bytes, plan  # noqa: E402

WORLD = 2
BATCH, SEQ = 4, 64  # enough tokens that activations, not the parameters, set the peak: offloading pays there


def test_offloading_plan_under_fsdp2_keeps_gradients_and_reports_host_bytes_per_rank():
    built = build_from_hf_config(TINY_LLAMA, batch_size=BATCH, seq_len=SEQ, dtype=torch.float32,
                                 device=torch.device("meta"))
    stats = collect_stats(built.model, built.inputs, loss_fn=built.loss_fn, fsdp=FsdpSetup(WORLD),
                          cost_model=RooflineCostModel(device_spec("cpu")))
    p = plan(stats, 0.7 * baseline_peak_bytes(stats) / GIB, offload="on", host_link_gbps=1e6)
    assert p.status == "optimal" and p.host_bytes, (p.status, p.message)
    tolerated = sum(op.output_bytes for pm in p.modules for k, op in enumerate(stats.module(pm.fqn).ops)
                    if pm.offload and pm.offload[k] and op.name in TOLERATED_OPS)
    results = run_ranks(run_offload_rank, WORLD, p.model_dump(mode="json"), stats.model_dump(mode="json"), BATCH, SEQ)
    for r in results:
        assert r["grads_equal"], r["rank"]
        (_, host1), (peak2, host2) = r["planned"]
        assert host1 == host2 == p.host_bytes - tolerated, (r["rank"], r["planned"], p.host_bytes)
        assert peak2 <= p.memory_budget_gib * GIB and abs(peak2 - p.peak_bytes) <= 0.02 * p.peak_bytes, (
            r["rank"], r["planned"], p.peak_bytes)

"""What each rank of a real FSDP2 job runs in the tests: gloo on the CPU, spawned processes, a tiny Llama."""

from __future__ import annotations

from typing import Any

import torch

from est_helpers import TINY_LLAMA


def sharded_tiny_llama(world_size: int, plan: dict | None, stats: dict | None, batch: int = 2, seq: int = 32) -> Any:
    """The tiny Llama (seed 0), the plan applied first, then fully_shard over its decoder layers and root.

    The order torchtitan uses: activation checkpointing wraps the blocks
    before fully_shard makes them units, so FSDP2's gathers run in the unit's
    hooks, outside the checkpointed forward.
    """
    from torch.distributed.device_mesh import init_device_mesh

    from estimators import apply_plan, build_from_hf_config, shard

    torch.manual_seed(0)
    built = build_from_hf_config(TINY_LLAMA, batch_size=batch, seq_len=seq, dtype=torch.float32,
                                 device=torch.device("cpu"))
    if plan is not None:
        apply_plan(built.model, plan, stats=stats)
    shard(built.model, init_device_mesh("cpu", (world_size,)), world_size=world_size)
    return built


def run_rank(rank: int, world_size: int, plan: dict, stats: dict) -> dict[str, Any]:
    """One rank (under ``estimators.measure.real_fsdp.run_ranks``): the unplanned and the planned sharded model, one
    backward each (grads), two measured steps each."""
    from estimators import call_model, make_optimizer, measure_steps

    result: dict[str, Any] = {"rank": rank}
    grads = {}
    for name, p in (("plain", None), ("planned", plan)):
        built = sharded_tiny_llama(world_size, p, stats if p else None)
        torch.manual_seed(0)
        call_model(built.model, built.inputs).loss.backward()
        grads[name] = [q.grad.to_local().clone() for q in built.model.parameters()]
        built.model.zero_grad(set_to_none=True)
        opt = make_optimizer("adamw", list(built.model.parameters()))
        result[name] = [m.peak_bytes for m in measure_steps(built.model, built.inputs, None, opt, steps=2)]
    result["max_grad_diff"] = max(float((a - b).abs().max()) for a, b in zip(grads["plain"], grads["planned"]))
    result["grads_equal"] = all(torch.equal(a, b) for a, b in zip(grads["plain"], grads["planned"]))
    return result


def run_offload_rank(rank: int, world_size: int, plan: dict, stats: dict, batch: int, seq: int) -> dict[str, Any]:
    """One rank with a plan that offloads: gradients against the unplanned sharded model, then two steps of the
    planned one measured (``measure_fsdp_steps``: host bytes booked apart)."""
    from estimators import call_model, make_optimizer
    from estimators.measure import measure_fsdp_steps

    grads = {}
    for name, p in (("plain", None), ("planned", plan)):
        built = sharded_tiny_llama(world_size, p, stats if p else None, batch, seq)
        torch.manual_seed(0)
        call_model(built.model, built.inputs).loss.backward()
        grads[name] = [q.grad.to_local().clone() for q in built.model.parameters()]
    built.model.zero_grad(set_to_none=True)
    opt = make_optimizer("adamw", list(built.model.parameters()))
    steps = measure_fsdp_steps(built.model, built.inputs, None, opt, steps=2)
    return {"rank": rank, "planned": [(m.peak_bytes, m.host_peak_bytes) for m in steps],
            "grads_equal": all(torch.equal(a, b) for a, b in zip(grads["plain"], grads["planned"]))}

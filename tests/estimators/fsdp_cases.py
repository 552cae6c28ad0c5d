"""What the 2-rank FSDP2 tests run on every rank (importable by name: ``run_ranks`` pickles it)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from estimators import build_from_hf_config, make_optimizer, measure_fsdp_steps, shard
from estimators.measure import SettledAllGather, SettledReduceScatter, settle_gloo_collectives

HAND_FEATURES, HAND_BATCH = 64, 8  # two bias-free Linear(64, 64) units, an (8, 64) input
# before gloo_comms waited for it, gloo's late release hit 1 repeat in 500 to 2,500 per rank (4 runs of 2 x 2,000,
# loaded and not): 2 x 500 repeats catch that about half the time, in about a second; test_gloo_comms.py shows
# deterministically that the wait fails on a buffer still held
RELEASE_REPEATS = 500


def hand_case(mesh: Any) -> list[Any]:
    """Two ``Linear`` units and the (empty) root, fp32, AdamW: the case computed by hand in the test."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(HAND_FEATURES, HAND_FEATURES, bias=False),
                          nn.Linear(HAND_FEATURES, HAND_FEATURES, bias=False))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    settle_gloo_collectives(model)  # as shard_model does on gloo: buffers freed in FSDP2's program order
    opt = make_optimizer("adamw", list(model.parameters()))
    x = torch.randn(HAND_BATCH, HAND_FEATURES)
    return measure_fsdp_steps(model, x, lambda out: out.sum(), opt, steps=3)


def llama_case(mesh: Any, config: dict, batch: int, seq: int, mixed_precision: str | None) -> list[Any]:
    """The tiny llama, ``fully_shard`` per decoder layer and the root, AdamW, three steps."""
    torch.manual_seed(0)
    built = build_from_hf_config(config, batch_size=batch, seq_len=seq, dtype=torch.float32,
                                 device=torch.device("cpu"))
    shard(built.model, mesh, world_size=mesh.size(), mixed_precision=mixed_precision)
    opt = make_optimizer("adamw", list(built.model.parameters()))
    return measure_fsdp_steps(built.model, built.inputs, built.loss_fn, opt, steps=3, seed=1)


def release_case(mesh: Any, repeats: int = RELEASE_REPEATS, n: int = 1024) -> list[tuple[bool, bool, bool, bool]]:
    """FSDP2's collectives as ``shard_model`` gives them on gloo: right values, and buffers the caller drops
    right after the call freed there and then (not later by gloo's worker thread); per repeat: (all-gather
    values right, its buffer freed, reduce-scatter values right, its buffers freed). Each weak reference is
    read right after the ``del``, before anything else runs, so a buffer gloo's thread frees a moment later
    counts as held."""
    import weakref

    import torch.distributed as dist

    group, rank, world = mesh.get_group(), mesh.get_rank(), mesh.size()
    out = []
    for _ in range(repeats):
        buf = SettledAllGather().allocate((world * n,), dtype=torch.float32, device=torch.device("cpu"))
        buf.narrow(0, rank * n, n).fill_(rank)
        SettledAllGather()(buf, buf.narrow(0, rank * n, n), group)
        ag_ref = weakref.ref(buf.untyped_storage())
        gathered = torch.equal(buf, torch.arange(world, dtype=torch.float32).repeat_interleave(n))
        del buf
        ag_freed = ag_ref() is None
        grad, shard = torch.full((world * n,), float(rank + 1)), torch.empty(n)
        SettledReduceScatter()(shard, grad, group, dist.ReduceOp.SUM)
        reduced = torch.equal(shard, torch.full((n,), float(world * (world + 1) // 2)))
        rs_refs = (weakref.ref(grad.untyped_storage()), weakref.ref(shard.untyped_storage()))
        del grad, shard
        out.append((gathered, ag_freed, reduced, all(r() is None for r in rs_refs)))
    return out


def accumulation_case(mesh: Any, config: dict, batch: int, seq: int, plan: Any, stats: Any,
                      sync_every_micro_batch: bool = True) -> list[Any]:
    """The tiny llama (``plan`` applied, if any), then sharded, 2 micro-batches per AdamW step, two steps; FSDP2
    reduces the gradients after each micro-batch (its default) or, ``sync_every_micro_batch`` False, after the
    last only."""
    from estimators import TrainingLoop, apply_plan

    torch.manual_seed(0)
    built = build_from_hf_config(config, batch_size=batch, seq_len=seq, dtype=torch.float32,
                                 device=torch.device("cpu"))
    if plan is not None:
        apply_plan(built.model, plan, stats=stats)
    shard(built.model, mesh, world_size=mesh.size())
    opt = make_optimizer("adamw", list(built.model.parameters()))
    return measure_fsdp_steps(built.model, built.inputs, built.loss_fn, opt, steps=2, seed=1,
                              loop=TrainingLoop(grad_accumulation=2), sync_every_micro_batch=sync_every_micro_batch)


def all_cases(rank: int, world_size: int, config: dict, batch: int, seq: int,
              accumulation: tuple[Any, Any, int, int] | None = None) -> dict[str, list[Any]]:
    """Every case, in one set of processes (starting ranks costs more than running the cases); ``accumulation``:
    (plan, stats, batch, seq) of the gradient accumulation case."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world_size,))
    out = {"release": release_case(mesh), "hand": hand_case(mesh), "llama": llama_case(mesh, config, batch, seq, None),
           "llama_bf16": llama_case(mesh, config, batch, seq, "bf16")}
    if accumulation is not None:
        plan, stats, acc_batch, acc_seq = accumulation
        out["accumulation"] = accumulation_case(mesh, config, acc_batch, acc_seq, plan, stats)
        out["accumulation_no_sync"] = accumulation_case(mesh, config, acc_batch, acc_seq, None, None, False)
    return out

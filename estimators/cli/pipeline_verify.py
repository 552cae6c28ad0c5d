"""Per-stage plans held to a real pipeline on this machine: 2+ gloo ranks on 127.0.0.1, one stage each.

Every rank builds the same decoder from the same config and seed, cuts it into
the same stages (:func:`estimators.common.build_stages`), applies its own
stage's plan (``estimators.apply_plan``) and runs the schedule
(:func:`estimators.measure.real_pipeline.measure_pipeline_stage`).
"""

from __future__ import annotations

from typing import Any

import torch

from estimators.apply import apply_plan
from estimators.collect import pipeline_loss
from estimators.common import PipelineSetup, RankChunks, build_stages
from estimators.measure import measure_pipeline_stage, run_ranks

__all__ = ["run_pipeline", "pipeline_rank"]


def pipeline_rank(rank: int, world: int, config: dict, setup: PipelineSetup, batch: int, seq: int, steps: int,
                  plans: list[dict | None], stats: list[dict | None], seed: int, tp_size: int = 1) -> dict:
    """One rank's stage: built, planned, run; what :func:`measure_pipeline_stage` returns.

    ``tp_size`` > 1: ranks ``stage * tp_size ...`` hold one stage, built as the collector runs it: tensor
    parallel over them (the model's HF plan), then the stage's plan; the stages talk over the pipeline's group."""
    if tp_size == 1:
        return _stage_rank(rank, world, config, setup, batch, seq, steps, plans, stats, seed)
    from torch.distributed.device_mesh import init_device_mesh

    from estimators.common import parallelize_tp
    from estimators.measure import SettledFunctionalCollectives

    mesh = init_device_mesh("cpu", (world // tp_size, tp_size), mesh_dim_names=("pp", "tp"))

    def tensor_parallel(stage: torch.nn.Module) -> None:
        parallelize_tp(stage, mesh["tp"])

    with SettledFunctionalCollectives():  # gloo lets go of TP's collective buffers in program order
        return _stage_rank(rank // tp_size, world // tp_size, config, setup, batch, seq, steps, plans, stats, seed,
                           tensor_parallel=tensor_parallel, group=mesh["pp"].get_group())


def _stage_rank(rank: int, world: int, config: dict, setup: PipelineSetup, batch: int, seq: int, steps: int,
                plans: list[dict | None], stats: list[dict | None], seed: int, *, tensor_parallel: Any = None,
                group: Any = None) -> dict:
    """Stage ``rank`` of ``world`` (pipeline ranks) built, tensor parallel applied if any, planned and run."""
    from transformers import AutoConfig, AutoModelForCausalLM

    doc = dict(config)
    cfg = AutoConfig.for_model(doc.pop("model_type"), **doc)
    cfg.use_cache = False
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    model.train()
    chunk_stages = build_stages(model, setup)
    if setup.virtual_stages > 1:  # interleaved: this rank's chunks, stages rank, rank + S, ...
        stage = RankChunks(model, chunk_stages[rank::setup.stages])
    else:
        stage = chunk_stages[rank]
    if tensor_parallel is not None:
        tensor_parallel(stage)
    if plans[rank] is not None and plans[rank].get("modules"):
        apply_plan(stage, plans[rank], stats=stats[rank])
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, cfg.vocab_size, (batch * setup.microbatches, seq), generator=gen)
    opt = torch.optim.AdamW(stage.parameters(), foreach=False)
    hidden = torch.empty(batch, seq, cfg.hidden_size, device="meta", requires_grad=True)  # sends a gradient back
    n = setup.chunks

    def io(g: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (ids[:batch].to("meta") if g == 0 else hidden,
                torch.empty(batch, seq, cfg.vocab_size, device="meta") if g == n - 1 else hidden)

    io_meta = [io(rank + world * v) for v in range(setup.virtual_stages)] if setup.virtual_stages > 1 else io(rank)
    return measure_pipeline_stage(stage, rank, world, setup.schedule, setup.microbatches, ids, ids.clone(),
                                  pipeline_loss, opt, steps, io_meta=io_meta, group=group)


def run_pipeline(config: dict, setup: PipelineSetup, *, batch: int, seq: int, steps: int = 3,
                 plans: list[Any] | None = None, stats: list[Any] | None = None, seed: int = 0,
                 tp_size: int = 1) -> list[dict]:
    """Every rank's result of a real pipeline (plans per stage, None: unplanned): ``setup.stages`` ranks, times
    ``tp_size`` with tensor parallel inside each stage (:func:`pipeline_rank`: rank ``stage * tp_size + t``)."""
    n = setup.stages
    plans_doc = [None if p is None else (p.model_dump(mode="json") if hasattr(p, "model_dump") else p)
                 for p in (plans or [None] * n)]
    stats_doc = [None if s is None else (s.model_dump(mode="json") if hasattr(s, "model_dump") else s)
                 for s in (stats or [None] * n)]
    return run_ranks(pipeline_rank, n * tp_size, config, setup, batch, seq, steps, plans_doc, stats_doc, seed,
                     tp_size)

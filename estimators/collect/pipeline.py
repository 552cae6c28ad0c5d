"""Collecting every stage of a pipeline-parallel job: one fake step per stage, one stats document each.

Each stage (:func:`estimators.common.build_stages`) runs as
``torch.distributed.pipelining.PipelineStage`` runs it: two microbatches, so
the second's moments hold the first one's parameter and input gradients, each
a forward and a backward with the stage's P2P buffers as inputs. A stage
other than the first takes the received activation (a leaf that requires
grad: its gradient is what the stage sends back); a stage other than the last
ends in :class:`_SendBoundary`, whose backward hands autograd the gradient
receive buffer, as ``torch.autograd.backward(output, grad)`` does. The stage's
output is kept from its forward to the end of its backward (the schedule's
forward cache). The planner lays the moments out along the schedule
(:mod:`planner.pipeline`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from estimators.collect.collector import collect_stats
from estimators.common import PipelineSetup, RankChunks, build_stages, make_optimizer
from planner import Stats
from planner.stats.pipeline import PipelineChunkInfo, PipelineStageInfo

__all__ = ["collect_interleaved_ranks", "collect_pipeline_stages", "pipeline_loss"]


def pipeline_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The last stage's loss per microbatch: token cross-entropy of the logits against the labels."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


class _SendBoundary(torch.autograd.Function):
    """A stage's end: a scalar to call backward on, whose gradient for the output is the received gradient."""

    @staticmethod
    def forward(ctx: Any, output: torch.Tensor, received_grad: torch.Tensor) -> torch.Tensor:
        ctx.received = received_grad
        return output.new_zeros(())

    @staticmethod
    def backward(ctx: Any, _: torch.Tensor) -> tuple[torch.Tensor, None]:
        received, ctx.received = ctx.received, None
        return received, None


class _HeldOutput:
    """The stage's output, kept from the loss until the next microbatch starts or the optimizer is built."""

    def __init__(self) -> None:
        self.output: Any = None

    def clear(self, *_: Any) -> None:
        self.output = None


def _stage_io(stage: int, stages: int, ids: torch.Tensor, hidden: tuple[int, ...], dtype: torch.dtype,
              held: _HeldOutput) -> tuple[torch.Tensor, Callable, list[torch.Tensor]]:
    """(the stage's input, its loss function, the per-microbatch tensors it keeps) for stage ``stage``."""
    first, last = stage == 0, stage == stages - 1
    x = ids if first else torch.empty(hidden, dtype=dtype, device="meta", requires_grad=True)
    kept = [x]
    if last:
        labels = ids.clone()
        kept.append(labels)

        def loss_fn(out: torch.Tensor) -> torch.Tensor:
            held.output = out
            return pipeline_loss(out, labels)
    else:
        received_grad = torch.empty(hidden, dtype=dtype, device="meta")
        kept.append(received_grad)

        def loss_fn(out: torch.Tensor) -> torch.Tensor:
            held.output = out
            return _SendBoundary.apply(out, received_grad)
    return x, loss_fn, kept


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _loss_saved_bytes(logits_shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """What the last stage's loss saves for its backward beyond the logits (log-softmax's output): a microbatch
    waiting for its backward keeps it, so its held bytes count it. Measured on fake tensors of the same shapes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    saved: dict[int, int] = {}
    with FakeTensorMode():
        logits = torch.empty(logits_shape, dtype=dtype, requires_grad=True)
        labels = torch.zeros(logits_shape[:-1], dtype=torch.long)
        given = {id(x.untyped_storage()) for x in (logits, labels)}

        def pack(t: torch.Tensor) -> torch.Tensor:
            st = t.untyped_storage()
            if id(st) not in given:
                saved[id(st)] = st.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = pipeline_loss(logits, labels)
        del loss
    return sum(saved.values())


def _collect_held(module: nn.Module, inputs: tuple, loss_fn: Callable, held: _HeldOutput, *, dtype: torch.dtype,
                  optimizer: str, optimizer_kwargs: dict | None, optimizer_foreach: bool, progress: Any,
                  collect_kwargs: dict) -> Stats:
    """``module``'s two microbatches collected (``collect_kwargs`` to collect_stats, its metadata copied), the
    output ``held`` from the loss until the next microbatch starts or the optimizer is built."""

    def build_optimizer(params: list[nn.Parameter]) -> torch.optim.Optimizer | None:
        held.clear()  # the last backward is done: the schedule has let the output go
        return make_optimizer(optimizer, params, foreach=optimizer_foreach, kwargs=optimizer_kwargs)

    hook = module.register_forward_pre_hook(held.clear)
    kwargs = dict(collect_kwargs)
    if kwargs.get("metadata") is not None:
        kwargs["metadata"] = kwargs["metadata"].model_copy(deep=True)
    try:
        return collect_stats(module, inputs, loss_fn=loss_fn, optimizer=build_optimizer, grad_accumulation=2,
                             dtype=dtype, progress=progress, **kwargs)
    finally:
        hook.remove()


def collect_pipeline_stages(model: nn.Module, ids: torch.Tensor, setup: PipelineSetup, *, dtype: torch.dtype,
                            optimizer: str, optimizer_kwargs: dict | None, optimizer_foreach: bool,
                            progress: Any = None, **collect_kwargs: Any) -> list[Stats]:
    """Every stage's stats: ``ids`` (batch, seq) is one microbatch's tokens; ``collect_kwargs`` go to collect_stats.

    Interleaved 1F1B: one document per rank, its chunks run as one microbatch passes them
    (:func:`collect_interleaved_ranks`).
    """
    if setup.virtual_stages != 1:
        return collect_interleaved_ranks(model, ids, setup, dtype=dtype, optimizer=optimizer,
                                         optimizer_kwargs=optimizer_kwargs, optimizer_foreach=optimizer_foreach,
                                         progress=progress, **collect_kwargs)
    stages = build_stages(model, setup)
    width = int(model.config.hidden_size)
    out = []
    for s, stage in enumerate(stages):
        if progress:
            progress("stage", s + 1, len(stages))
        held = _HeldOutput()
        x, loss_fn, kept = _stage_io(s, len(stages), ids, (*ids.shape, width), dtype, held)

        stats = _collect_held(stage, (x,), loss_fn, held, dtype=dtype, optimizer=optimizer,
                              optimizer_kwargs=optimizer_kwargs, optimizer_foreach=optimizer_foreach,
                              progress=progress, collect_kwargs=collect_kwargs)
        root = stats.root
        held_bytes = root.act_saved_bytes + root.output_bytes
        if s == len(stages) - 1:
            held_bytes += _loss_saved_bytes((*ids.shape, int(model.config.vocab_size)), dtype)
        stats.metadata.optimizer = optimizer
        stats.metadata.optimizer_kwargs = optimizer_kwargs
        stats.metadata.pipeline = PipelineStageInfo(
            stage=s, stages=len(stages), schedule=setup.schedule, microbatches=setup.microbatches,
            held_bytes=held_bytes,
            # the last stage's schedule also keeps every microbatch's loss (a scalar)
            buffer_bytes=_nbytes(kept) + (4 if s == len(stages) - 1 else 0),
            input_grad_bytes=0 if s == 0 else _nbytes([x]))
        out.append(stats)
    return out


def _chunk_infos(stage_stats: list[Stats], stage_modules: list[nn.Module], rank: int, setup: PipelineSetup,
                 dtype: torch.dtype, root: str) -> list[PipelineChunkInfo]:
    """Rank ``rank``'s chunks, each measured as the stage of a pipeline of every chunk it is; module FQNs as the
    rank's stats name them (under ``root``)."""
    size = torch.empty((), dtype=dtype).element_size()
    out = []
    for v in range(setup.virtual_stages):
        g = rank + setup.stages * v
        info, mod = stage_stats[g].metadata.pipeline, stage_modules[g]
        owned = sorted({f for f, _ in mod.named_children() if f == "lm_head"} |
                       {f"model.{n}" for n in ("embed_tokens", "norm") if getattr(mod.model, n) is not None} |
                       {f"model.layers.{i}" for i in mod.model.layers})
        out.append(PipelineChunkInfo(stage_index=g, modules=[f"{root}.{f}" for f in owned], held_bytes=info.held_bytes,
                                     output_bytes=stage_stats[g].root.output_bytes,
                                     grad_bytes=sum(p.numel() for p in mod.parameters()) * size,
                                     input_grad_bytes=info.input_grad_bytes))
    return out


def collect_interleaved_ranks(model: nn.Module, ids: torch.Tensor, setup: PipelineSetup, *, dtype: torch.dtype,
                              optimizer: str, optimizer_kwargs: dict | None, optimizer_foreach: bool,
                              progress: Any = None, **collect_kwargs: Any) -> list[Stats]:
    """Every rank's stats under interleaved 1F1B: its V chunks (stages ``rank + S x v``) run as one microbatch
    passes them (each chunk's forward in order, then each one's backward in reverse), two microbatches; each
    chunk's own sizes measured as a stage of a pipeline of all S x V chunks (``metadata.pipeline.chunks``)."""
    chunked = PipelineSetup(setup.chunks, "1f1b", setup.microbatches, setup.split)
    stage_stats = collect_pipeline_stages(model, ids, chunked, dtype=dtype, optimizer=optimizer,
                                          optimizer_kwargs=optimizer_kwargs, optimizer_foreach=optimizer_foreach,
                                          **collect_kwargs)
    stage_modules = build_stages(model, chunked)
    width, n = int(model.config.hidden_size), setup.chunks
    out = []
    for r in range(setup.stages):
        if progress:
            progress("rank", r + 1, setup.stages)
        rank_module = RankChunks(model, [stage_modules[r + setup.stages * v] for v in range(setup.virtual_stages)])
        held = _HeldOutput()
        ios = [_stage_io(r + setup.stages * v, n, ids, (*ids.shape, width), dtype, held)
               for v in range(setup.virtual_stages)]
        targets = [io[2][1] for io in ios]  # per chunk: the labels (the last stage) or the received gradient
        ends_in_loss = [r + setup.stages * v == n - 1 for v in range(setup.virtual_stages)]

        def loss_fn(outs: tuple[torch.Tensor, ...]) -> torch.Tensor:
            held.output = outs
            losses = [pipeline_loss(o, t) if end else _SendBoundary.apply(o, t)
                      for o, t, end in zip(outs, targets, ends_in_loss)]
            return sum(losses[1:], losses[0])

        stats = _collect_held(rank_module, tuple(io[0] for io in ios), loss_fn, held, dtype=dtype,
                              optimizer=optimizer, optimizer_kwargs=optimizer_kwargs,
                              optimizer_foreach=optimizer_foreach, progress=progress, collect_kwargs=collect_kwargs)
        chunks = _chunk_infos(stage_stats, stage_modules, r, setup, dtype, stats.root.fqn)
        stats.metadata.optimizer = optimizer
        stats.metadata.optimizer_kwargs = optimizer_kwargs
        stats.metadata.pipeline = PipelineStageInfo(
            stage=r, stages=setup.stages, schedule=setup.schedule, microbatches=setup.microbatches,
            virtual_stages=setup.virtual_stages, chunks=chunks,
            held_bytes=sum(c.held_bytes for c in chunks),
            buffer_bytes=sum(_nbytes(io[2]) for io in ios) + (4 if r == setup.stages - 1 else 0),
            input_grad_bytes=sum(c.input_grad_bytes for c in chunks))
        out.append(stats)
    return out

"""A real pipeline-parallel stage on this machine (gloo, CPU): its steps, its peak memory, its losses and gradients.

One rank runs one stage under ``torch.distributed.pipelining`` (``PipelineStage``
with ``Schedule1F1B`` or ``ScheduleGPipe``), the steps a training loop runs
(``schedule.step``, ``optimizer.step()``, ``zero_grad(set_to_none=True)``),
its memory counted as every other real step here is (every distinct live
storage once: :func:`estimators.measure.track_live_storages`). The P2P sends
and receives need nothing of gloo's collectives fix: a receive writes into the
stage's own preallocated buffer and a send reads the stage's tensor, so gloo
holds no buffer of its own for them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from estimators.measure.real_step import BACKWARD, FORWARD, OPTIMIZER, track_live_storages

__all__ = ["measure_pipeline_stage"]


def measure_pipeline_stage(stage_module: nn.Module, stage: int, stages: int, schedule: str, microbatches: int,
                           batch: torch.Tensor, labels: torch.Tensor, loss_fn: Any, optimizer: torch.optim.Optimizer,
                           steps: int, *, io_meta: tuple[torch.Tensor, torch.Tensor], group: Any = None) -> dict:
    """Run ``steps`` steps of this rank's stage; per step its peak bytes, and the last step's losses and
    gradients (each parameter's gradient sum and norm).

    ``batch`` and ``labels``: the whole step's (microbatches x per-microbatch batch); every rank passes them,
    the first stage uses the batch, the last the labels. ``io_meta``: one microbatch's stage input and output
    as meta tensors (the static metadata mode: no shape inference over P2P at the first step); interleaved-1f1b
    (``stage_module`` a :class:`estimators.common.RankChunks`): one such pair per chunk. ``group``: the
    pipeline's process group when the job has other dimensions (a stage tensor-parallel over ranks of its own);
    None: the default group, one rank per stage.
    """
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    kinds = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe, "interleaved-1f1b": ScheduleInterleaved1F1B}
    if schedule not in kinds:
        raise ValueError(f"schedule {schedule!r}: only {', '.join(kinds)} run here")
    chunks = getattr(stage_module, "chunks", None)
    if schedule == "interleaved-1f1b":
        if chunks is None:
            raise ValueError("interleaved-1f1b runs a RankChunks (one rank's model chunks)")
        pipe_stages = [PipelineStage(c, stage + stages * v, stages * len(chunks), torch.device("cpu"),
                                     input_args=io[0], output_args=io[1], group=group)
                       for v, (c, io) in enumerate(zip(chunks, io_meta))]
        last = stage == stages - 1  # the last rank holds the pipeline's last stage (its last chunk)
        # every rank gets the loss function: a schedule without one runs no backward
        sched = ScheduleInterleaved1F1B(pipe_stages, n_microbatches=microbatches, loss_fn=loss_fn)
    else:
        pipe_stages = [PipelineStage(stage_module, stage, stages, torch.device("cpu"), input_args=io_meta[0],
                                     output_args=io_meta[1], group=group)]
        last = stage == stages - 1
        sched = kinds[schedule](pipe_stages[0], n_microbatches=microbatches, loss_fn=loss_fn)
    peaks, losses, where = [], [], []
    with track_live_storages(stage_module) as tracker:
        for pipe_stage in pipe_stages:
            _follow_phases(pipe_stage, tracker)
        for _ in range(steps):
            tracker.restart_peak()
            step_losses: list[torch.Tensor] = []
            args = (batch,) if stage == 0 else ()
            kwargs = {"target": labels, "losses": step_losses} if last else {}
            sched.step(*args, return_outputs=False, **kwargs)
            # each gradient's sum and norm: scalars, so the step's memory is as it would be
            grads = {n: (float(p.grad.sum()), float(p.grad.norm())) for n, p in stage_module.named_parameters()
                     if p.grad is not None}
            tracker.phase, tracker.micro_batch = OPTIMIZER, None
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            peaks.append(tracker.peak_bytes)
            where.append((tracker.peak_phase, tracker.peak_micro_batch))
            losses = [float(x.detach()) for x in step_losses]
    dist.barrier()
    return {"peaks": peaks, "peak_at": where, "losses": losses, "grads": grads}


def _follow_phases(pipe_stage: Any, tracker: Any) -> None:
    """Point the tracker's phase and microbatch (from 1) at what the stage runs: its peak says where it was."""
    for name, phase in (("forward_one_chunk", FORWARD), ("backward_one_chunk", BACKWARD)):
        run = getattr(pipe_stage, name)

        def wrapped(chunk: int, *args: Any, run: Any = run, phase: str = phase, **kwargs: Any) -> Any:
            tracker.phase, tracker.micro_batch = phase, chunk + 1 + 100 * pipe_stage.stage_index  # DEBUG
            return run(chunk, *args, **kwargs)

        setattr(pipe_stage, name, wrapped)

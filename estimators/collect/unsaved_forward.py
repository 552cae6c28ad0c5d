"""What the forward-moment fields of the stats need from the step (``forward_live_bytes``, ``unsaved_last_ops``).

* :class:`ForwardLive`: per op recorded in the forward, the most live bytes but parameters, gradients and
  optimizer state since the op before (the timeline's ``activation_bytes``, op by op);
* :func:`record_unsaved_lives`: one more forward after the step, under saved-tensor hooks that keep nothing, so
  each storage dies as under checkpointing for an op the plan recomputes (autograd saves nothing inside a
  checkpointed module); its ops are recorded apart (as a later micro-batch's), off the timeline, and matched to the
  step's by position (:meth:`RecomputeLife.match_unsaved`: a forward that ran other ops leaves the figure out).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack
from typing import Any

import torch

from estimators.collect.fake_step import forward_and_loss
from estimators.collect.models import hf_fake_as_real
from estimators.collect.module_hooks import ModuleHooks
from estimators.collect.moe import one_hot_as_on_device
from estimators.collect.recompute_life import RecomputeLife
from estimators.collect.step_loop import scratch_ops, scratch_records
from estimators.collect.timeline import TimelineRecorder
from estimators.common import ACT, GRAD, OPT, PARAM, StorageBook, TrainingLoop

__all__ = ["ForwardLive", "record_unsaved_lives"]


class ForwardLive:
    """The most live activation bytes since the last op recorded."""

    def __init__(self) -> None:
        self.most = 0

    def on_alloc(self, _category: str, live: dict[str, int]) -> None:
        """A :attr:`StorageBook.on_alloc` callback (the backward's are taken by no op of the first forward)."""
        self.most = max(self.most, sum(live.values()) - live[PARAM] - live[GRAD] - live[OPT])

    def take(self, live: dict[str, int]) -> int:
        """The most since the op before, up to ``live`` now (an op's outputs made); starts over."""
        self.on_alloc(ACT, live)
        most, self.most = self.most, 0
        return most


def record_unsaved_lives(step: Any, fake_in: Any, fake_loss: Any, loss_fn: Any, emulation: Any, loop: TrainingLoop,
                         device: torch.device) -> None:
    """The forward of the collector's ``step`` (its model and loss) once more with nothing saved for backward, as
    the step's micro-batches run it, the step's storages given their deaths there (``col.life``); not for sharded
    or compiled steps (their hooks and graphs would run again)."""
    if step.setup is not None or step.compile_backend is not None:
        return
    col, book, values = step.col, step.book, step.values
    contexts = (emulation, hf_fake_as_real(step.model, values), one_hot_as_on_device(),
                loop.autocast_context(device.type))
    # what the stats tag of the step (batch values read, attention kernels) counts its own forward only
    reads, kernels = len(values.reads), dict(getattr(emulation, "kernels", {}))
    try:
        _record(col, book, step.mods, values, contexts,
                lambda: forward_and_loss(step.model, fake_in, fake_loss, loss_fn))
    finally:
        del values.reads[reads:]
        if hasattr(emulation, "kernels"):
            emulation.kernels.clear()
            emulation.kernels.update(kernels)


def _record(col: Any, book: StorageBook, mods: dict, values: Any, contexts: Sequence[AbstractContextManager],
            forward: Callable[[], Any]) -> None:
    recorder, life = col.timeline, col.life
    book.on_alloc.remove(recorder.on_alloc)
    col.timeline, col.life, col.phase = TimelineRecorder(recorder.running), RecomputeLife(), ACT
    values.active = True
    try:
        with ExitStack() as stack:
            for context in (ModuleHooks(col, book, scratch_records(mods), None), scratch_ops(col),
                            torch.autograd.graph.saved_tensors_hooks(_keep_nothing, _unpack_nothing), *contexts):
                stack.enter_context(context)
            shadow = col.ops
            forward()  # its output and loss die here
        unsaved = col.life
    finally:
        values.active = False
        col.timeline, col.life = recorder, life
        book.on_alloc.append(recorder.on_alloc)
    life.match_unsaved(col.ops, shadow, unsaved)


def _keep_nothing(_t: torch.Tensor) -> None:
    return None


def _unpack_nothing(_packed: None) -> None:
    raise RuntimeError("the collector's forward without saved tensors has no backward")

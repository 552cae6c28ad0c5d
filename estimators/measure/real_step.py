"""Real training steps, measured: peak live bytes, where the peak happened, CPU time.

The ground truth the planner's predictions are held to (``bench/bench_fidelity.py``,
``tests/estimators/measure/test_fidelity.py``). A step is what the collector models:
forward and loss, ``loss.backward()`` (the output dropped first, the loss
after), ``optimizer.step()``, ``optimizer.zero_grad(set_to_none=True)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from estimators.common import (ACT, BUFFER, GRAD, INPUT, OPT, PARAM, TEMP, HostBook, StorageBook, TrainingLoop,
                               call_model, default_loss, follow_storage_resizes, is_host_side, makes_host_copy,
                               storages_of, tensors_in)

__all__ = ["StepMeasure", "measure_steps", "track_live_storages", "LiveStorages", "PHASES", "FORWARD", "BACKWARD",
           "OPTIMIZER"]

FORWARD, BACKWARD, OPTIMIZER = "forward", "backward", "optimizer"
PHASES = (FORWARD, BACKWARD, OPTIMIZER)
# What a storage first seen in each phase is booked as (the category names of estimators.common.storage_book).
_PHASE_CATEGORY = {FORWARD: ACT, BACKWARD: TEMP, OPTIMIZER: OPT}


@dataclass(frozen=True)
class StepMeasure:
    """One real training step.

    ``peak_bytes``: the most bytes live at once during the step (see
    :func:`measure_steps` for what counts); ``peak_phase``: the phase it
    happened in; ``peak_live_bytes``: the live bytes then, per category
    (``param``, ``buffer``, ``input``, ``act`` (made in forward), ``temp``
    (made in backward, gradients not yet accumulated), ``grad``, ``opt``);
    ``start_bytes``: live at the step's start. All four are None when memory
    was not tracked. ``cpu_seconds``: process CPU time of the whole step,
    ``phase_cpu_seconds`` the same per phase (summed over micro-batches).
    ``peak_micro_batch``: with gradient accumulation, the micro-batch (from
    1) the peak happened in; None in the optimizer step or with one.
    ``host_peak_bytes``: the most host bytes live at once (activations a plan
    offloads, made under :func:`estimators.common.host_side`, never counted in
    ``peak_bytes``); ``host_live_bytes``: the host bytes live at the device
    peak. Both None when the step made no host storage (nothing offloaded).
    """

    step: int
    loss: float
    cpu_seconds: float
    phase_cpu_seconds: dict[str, float]
    peak_bytes: int | None = None
    peak_phase: str | None = None
    peak_live_bytes: dict[str, int] | None = field(default=None, repr=False)
    start_bytes: int | None = None
    peak_micro_batch: int | None = None
    host_peak_bytes: int | None = None
    host_live_bytes: int | None = None


class LiveStorages(TorchDispatchMode):
    """Books every storage an op returns, once, and follows the peak of everything booked.

    A compiled model runs compiled under it: dynamo runs a frame eagerly while any dispatch mode that does not
    ignore compile internals is active, so without ``ignore_compile_internals`` every "compiled" step measured
    would be the eager one. The compiled graph's ops then reach the mode at run time (``aot_eager``: every ATen
    op); a higher-order operator of the graph (checkpointing's ``run_and_save_rng_state``) runs as one op whose
    outputs are booked.

    Storages made under :func:`estimators.common.host_side` (an offloading store's host copies) go to
    ``host_book`` instead, never into the device book and its peak.
    """

    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __init__(self, book: StorageBook):
        super().__init__()
        self.book = book
        self.phase = FORWARD
        self.micro_batch: int | None = None
        self.peak_bytes = 0
        self.peak_phase = FORWARD
        self.peak_micro_batch: int | None = None
        self.peak_live: dict[str, int] = {}
        self.host_book = HostBook()
        self.host_at_peak: int | None = None
        book.on_alloc.append(self._on_alloc)

    def live_bytes(self) -> int:
        """The bytes of every booked storage still alive."""
        return sum(self.book.live.values())

    def restart_peak(self) -> None:
        """Start a new peak from what is live now (a step's start)."""
        self.peak_bytes, self.peak_phase, self.peak_live = self.live_bytes(), self.phase, dict(self.book.live)
        self.peak_micro_batch = self.micro_batch
        self.host_book.restart()
        self.host_at_peak = self.host_book.peak_bytes

    def host_figures(self) -> tuple[int | None, int | None]:
        """(host peak, host bytes at the device peak) since the last :meth:`restart_peak`; (None, None) if no
        host storage was made."""
        if self.host_book.peak_bytes is None:
            return None, None
        return self.host_book.peak_bytes, self.host_at_peak or 0

    def _on_alloc(self, category: str, live: dict[str, int]) -> None:
        total = sum(live.values())
        if total > self.peak_bytes:
            self.peak_bytes, self.peak_phase, self.peak_live = total, self.phase, dict(live)
            self.peak_micro_batch = self.micro_batch if self.phase != OPTIMIZER else None
            self.host_at_peak = self.host_book.live_bytes()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if is_host_side() or makes_host_copy(func):
            self.host_book.add(out)
            return out
        category = _PHASE_CATEGORY[self.phase]
        for st in storages_of(out):
            self.book.add(st, category)
        return out


def _book_existing(book: StorageBook, model: nn.Module, inputs: Any, optimizer: torch.optim.Optimizer) -> None:
    """Book what exists before a step (a no-op for what is booked already)."""
    book.add_tensors(model.parameters(), PARAM)
    book.add_tensors(model.buffers(), BUFFER)
    book.add_tensors([p.grad for p in model.parameters() if p.grad is not None], GRAD)
    book.add_tensors(tensors_in([list(s.values()) for s in optimizer.state.values()]), OPT)
    book.add_tensors(tensors_in(inputs), INPUT)


def _one_step(model: nn.Module, inputs: Any, loss_fn: Callable[[Any], torch.Tensor],
              optimizer: torch.optim.Optimizer, tracker: LiveStorages | None, loop: TrainingLoop,
              scaler: Any) -> tuple[float, dict[str, float]]:
    """Run one optimizer step (every micro-batch); return the last micro-batch's loss and the CPU seconds per phase."""
    seconds = dict.fromkeys(PHASES, 0.0)
    device_type = next((p.device.type for p in model.parameters()), "cpu")

    def enter(phase: str, micro_batch: int | None = None) -> float:
        if tracker is not None:
            tracker.phase, tracker.micro_batch = phase, micro_batch
        return time.process_time()

    value = 0.0
    for k in range(1, loop.grad_accumulation + 1):
        micro = k if loop.grad_accumulation > 1 else None
        t = enter(FORWARD, micro)
        with loop.autocast_context(device_type):
            output = call_model(model, inputs)
            loss = loss_fn(output)
        del output
        seconds[FORWARD] += time.process_time() - t
        t = enter(BACKWARD, micro)
        (loss if scaler is None else scaler.scale(loss)).backward()
        value = loss.item()
        del loss
        seconds[BACKWARD] += time.process_time() - t
    t = enter(OPTIMIZER)
    loop.optimizer_step(optimizer, [p for g in optimizer.param_groups for p in g["params"]], scaler)
    optimizer.zero_grad(set_to_none=True)
    seconds[OPTIMIZER] = time.process_time() - t
    return value, seconds


def measure_steps(model: nn.Module, inputs: Any, loss_fn: Callable[[Any], torch.Tensor] | None,
                  optimizer: torch.optim.Optimizer, *, steps: int = 3, track_memory: bool = True,
                  seed: int | None = 0, loop: TrainingLoop | None = None) -> list[StepMeasure]:
    """Run ``steps`` real training steps of ``model`` on ``inputs`` and measure each.

    A step: ``loss_fn(model(inputs))`` (``inputs`` a tensor, a tuple of
    positional arguments or a dict of keyword arguments; ``loss_fn`` None
    takes ``output.loss``, else the sum of the first floating-point output),
    the output dropped, ``loss.backward()``, ``optimizer.step()``,
    ``optimizer.zero_grad(set_to_none=True)``. With ``seed``, step k runs
    after ``torch.manual_seed(seed + k)``, so two models given the same seed
    draw the same dropout masks. ``loop`` (:class:`estimators.common.TrainingLoop`,
    as the stats were collected with) makes a step the user's loop: that
    many micro-batches of ``inputs``, forward and loss under autocast, the
    loss scaled by one ``GradScaler`` kept across the steps, gradients
    clipped, then the optimizer step.

    Memory (``track_memory``): the peak of the bytes of every distinct live
    tensor storage, each counted once however many tensors view it, at its
    ``nbytes()`` (no allocator rounding or caching). Live means: every
    parameter, buffer, parameter gradient, optimizer state tensor and input
    tensor that exists when the step starts, plus every storage an aten op
    returns during the step (forward, recomputation under checkpointing,
    backward, optimizer) until it is freed (a weak-reference callback on the
    storage). Peaks are taken after each new storage, so an op's inputs and
    outputs count together. Storages resized in place
    (``UntypedStorage.resize_``: FSDP2's gathered parameters) are followed; a
    DTensor counts its local shard. A ``torch.compile``d model runs compiled
    (compile it before the tracked steps): under ``aot_eager`` every op of its
    graphs is seen. Not seen: memory a kernel allocates and frees internally
    without returning it (Inductor's buffers), and tensors of other objects
    the caller holds. Tracking slows the step down; measure time with
    ``track_memory=False``.

    Time: ``time.process_time()`` (process CPU time, all threads: call
    ``torch.set_num_threads(1)`` first for single-thread figures).
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps!r}")
    loss_fn = loss_fn or default_loss
    loop = loop or TrainingLoop()
    scaler = loop.grad_scaler_for(next((p.device.type for p in model.parameters()), "cpu"))
    book = StorageBook() if track_memory else None
    tracker = LiveStorages(book) if book is not None else None
    handles = [p.register_post_accumulate_grad_hook(_grad_booker(book)) for p in model.parameters()
               if book is not None and p.requires_grad]
    out: list[StepMeasure] = []
    try:
        for k in range(steps):
            if seed is not None:
                torch.manual_seed(seed + k)
            if tracker is None:
                loss, seconds = _one_step(model, inputs, loss_fn, optimizer, None, loop, scaler)
                out.append(StepMeasure(k + 1, loss, sum(seconds.values()), seconds))
                continue
            _book_existing(book, model, inputs, optimizer)
            tracker.phase, tracker.micro_batch = FORWARD, 1 if loop.grad_accumulation > 1 else None
            tracker.restart_peak()
            start = tracker.live_bytes()
            with tracker, follow_storage_resizes(book, lambda: _PHASE_CATEGORY[tracker.phase]):
                loss, seconds = _one_step(model, inputs, loss_fn, optimizer, tracker, loop, scaler)
            out.append(StepMeasure(k + 1, loss, sum(seconds.values()), seconds, tracker.peak_bytes,
                                   tracker.peak_phase, tracker.peak_live, start, tracker.peak_micro_batch,
                                   *tracker.host_figures()))
    finally:
        for h in handles:
            h.remove()
    return out


def _grad_booker(book: StorageBook) -> Callable[[torch.Tensor], None]:
    def book_grad(p: torch.Tensor) -> None:
        book.recategorize_all(storages_of(p.grad), GRAD)  # a DTensor's: its shard

    return book_grad


@contextmanager
def track_live_storages(model: nn.Module) -> Iterator[LiveStorages]:
    """Follow live memory, counted as :func:`measure_steps` counts it, while the block runs a training loop that is
    not ours (a ``transformers.Trainer``, a Lightning ``Trainer``).

    ``model``'s parameters and buffers are booked at the start; every storage an aten op returns inside the block
    (batches the data loader collates, activations, gradients, the optimizer's state) from then on until it is
    freed. The tracker yielded has ``peak_bytes`` (since the start or the last ``restart_peak()``) and
    ``live_bytes()``: call ``restart_peak()`` at a step's start and read ``peak_bytes`` at its end (a
    ``TrainerCallback``'s ``on_step_begin`` and ``on_step_end``). Its ``phase`` stays ``forward`` unless the
    caller sets it, so ``peak_phase`` says nothing here.
    """
    book = StorageBook()
    tracker = LiveStorages(book)
    book.add_tensors(model.parameters(), PARAM)
    book.add_tensors(model.buffers(), BUFFER)
    tracker.restart_peak()
    with tracker, follow_storage_resizes(book, lambda: _PHASE_CATEGORY[tracker.phase]):
        yield tracker

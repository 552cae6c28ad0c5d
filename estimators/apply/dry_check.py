"""A dry step that proves a plan maps onto the model before training starts.

:func:`check_plan` runs one forward and backward of the planned model in
eager mode (strict: every substantive op must be the stats' one) and, with
``compile_backend``, one traced forward under ``torch.compile`` whose op
sequences are recorded and aligned with the stats
(:func:`estimators.apply.alignment.align`). The model's gradients, buffers
and the RNG state are put back afterwards, so training starts exactly as
without the check.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from estimators.apply.alignment import Alignment, AmbiguousAlignment, align
from estimators.apply.offload_compile import enable_compiled_offload, refuse_offload_backend
from estimators.apply.policy import EAGER, OFFLOADED, ModulePlan, PlanMismatchError, planned_modules
from estimators.common import AUTOCAST_DTYPES, TrainingLoop, call_model, default_loss

__all__ = ["check_plan", "ModuleCheck", "COMPILE_BACKENDS"]

# Each is recorded with itself: inductor's graph passes and decompositions run before and during the AOT trace
# the policy tags, so its sequence can differ from aot_eager's (phi3: a clone where aot_eager has a view).
COMPILE_BACKENDS = ("eager", "aot_eager", "inductor")


@dataclass(frozen=True)
class ModuleCheck:
    """How one planned module's ops in one mode relate to the stats'."""

    fqn: str
    mode: str
    ops: int
    unseen_ops: int  # ops the stats did not see: recomputed (random ones: saved under compile)
    lost_saves: int  # ops the plan saves that this mode does not run (saves memory, costs recompute)


def check_plan(model: nn.Module, example_inputs: Any, *, loss_fn: Callable[[Any], torch.Tensor] | None = None,
               compile_backend: str | None = None) -> list[ModuleCheck]:
    """Run one dry training step of the planned ``model``; raise :class:`PlanMismatchError` if it cannot apply.

    ``example_inputs`` is a batch as the training loop passes it (a tensor,
    a tuple of arguments or a dict of keyword arguments). With
    ``compile_backend`` (one of ``COMPILE_BACKENDS``) the sequence
    ``torch.compile`` traces is recorded too; the check then calls
    ``torch._dynamo.reset()``, so compile the model after it.
    """
    if compile_backend is not None and compile_backend not in COMPILE_BACKENDS:
        raise ValueError(f"compile_backend must be one of {', '.join(COMPILE_BACKENDS)}, got {compile_backend!r}")
    plans = planned_modules(model)
    if not plans:
        raise ValueError(f"check_plan: {type(model).__name__} has no planned module: call apply_plan first")
    if compile_backend is not None and any(mp.offload is not None for mp in plans):
        refuse_offload_backend(compile_backend)
        enable_compiled_offload(model, next(mp.host_store for mp in plans if mp.host_store is not None))
    if not model.training:
        raise ValueError(f"check_plan runs a training step but {type(model).__name__} is in eval mode: call "
                         f"model.train() first (in eval mode planned modules are not checkpointed)")
    traced, tp = any(mp.traced_stats for mp in plans), _tensor_parallel(model)
    out = []
    if not (traced and tp and compile_backend is not None):  # a compiled TP plan: its traced recording only
        with _restored(model), _as_traced(traced and not tp):
            _step(model, example_inputs, loss_fn, backward=True, autocast=_stats_autocast(model, plans))
        out = [ModuleCheck(mp.fqn, EAGER, mp.last_call.count if mp.last_call else 0, 0, 0) for mp in plans]
    if compile_backend is not None:
        out += _record_compiled(model, plans, example_inputs, loss_fn, compile_backend)
    return out


def _stats_autocast(model: nn.Module, plans: list[ModulePlan]) -> Any:
    """The dry step's forward under the autocast the stats' step ran (the training loop's), if any."""
    wanted = next((mp.autocast[0] for mp in plans if mp.autocast and mp.autocast[0] in AUTOCAST_DTYPES), None)
    device_type = next((p.device.type for p in model.parameters()), "cpu")
    return TrainingLoop(autocast=wanted).autocast_context(device_type)


def _step(model: nn.Module, inputs: Any, loss_fn: Callable | None, *, backward: bool,
          autocast: Any = None) -> None:
    with torch.enable_grad():
        with autocast or nullcontext():  # forward and loss, as a training loop runs them under autocast
            loss = (loss_fn or default_loss)(call_model(model, inputs))
        if backward:
            loss.backward()


def _tensor_parallel(model: nn.Module) -> bool:
    """Whether the model holds DTensor parameters (tensor parallel applied).

    A TP model's plan made from stats of the compiled step gets no eager proof: run under the Python dispatcher
    (as AOTAutograd traces, so that the ops are the stats'), a functional collective's wait inside a selective
    checkpoint never completes on gloo (torch 2.13, seen on 2 ranks: both hang in ``wait_tensor`` under the
    checkpoint's caching mode, whatever the policy saves, and with ``_are_we_tracing`` forced off too; without
    the checkpoint, or without the dispatcher, it completes), and without the dispatcher the eager ops are not
    the traced ones (the llama's root: ``aten.eq`` where the stats have ``aten._to_copy``). Its check is the
    traced recording, aligned with the stats (every longest alignment giving each op one decision). Run eagerly
    (no compile backend), the collective's result is wrapped (``_wrap_tensor_autograd``), which the policy takes
    for the traced stats' ``wait_tensor``."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def _as_traced(traced: bool) -> Any:
    """Stats collected under a compile backend list the ops as AOTAutograd decomposes them (the Python
    dispatcher: ``native_dropout`` for ``dropout``): the eager proof runs them so."""
    if not traced:
        from contextlib import nullcontext

        return nullcontext()
    from torch._dispatch.python import enable_python_dispatcher

    return enable_python_dispatcher()


class _restored:
    """Gradients, buffers and RNG state as they were before the dry step."""

    def __init__(self, model: nn.Module):
        self.model = model

    def __enter__(self) -> None:
        self.grads = {p: p.grad for p in self.model.parameters()}
        for p in self.grads:
            p.grad = None
        self.buffers = [(b, b.detach().clone()) for b in self.model.buffers()]
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None

    def __exit__(self, *exc: Any) -> None:
        for p, g in self.grads.items():
            p.grad = g
        with torch.no_grad():
            for b, saved in self.buffers:
                b.copy_(saved)
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)


def _record_compiled(model: nn.Module, plans: list[ModulePlan], inputs: Any, loss_fn: Callable | None,
                     backend: str) -> list[ModuleCheck]:
    for mp in plans:
        mp.recording = {}
    try:
        torch._dynamo.reset()  # layout: allow-private (no cached graph may skip the recording)
        with _restored(model):
            _step(torch.compile(model, backend=backend), inputs, loss_fn, backward=False)
    finally:
        recorded = {mp.fqn: mp.recording or {} for mp in plans}
        for mp in plans:
            mp.recording = None
        torch._dynamo.reset()  # layout: allow-private (the recording's graphs carry no decisions)
    out = []
    for mp in plans:
        for mode, calls in recorded[mp.fqn].items():
            if mode == EAGER:
                continue
            mp.tables[mode] = _aligned(mp, mode, calls)
            for a in mp.tables[mode]:
                out.append(ModuleCheck(mp.fqn, f"{backend}/{mode}", len(a.names), a.unseen, len(a.lost_saves)))
    return out


def _aligned(mp: ModulePlan, mode: str, calls: list[list[tuple[str, bool, bool]]]) -> list[Alignment]:
    if mp.stats is None:
        raise PlanMismatchError(f"module {mp.fqn!r}: checking a plan under torch.compile needs op names: pass "
                                f"the stats to apply_plan, or a plan from planner.plan (it lists op_names)")
    stats = mp.stats
    if mp.offload is not None:  # offloaded ops align as decision 2, so that the traced table carries them
        stats = replace(stats, save=tuple(OFFLOADED if o else s for s, o in zip(stats.save, mp.offload)))
    out: dict[tuple, Alignment] = {}
    for call in calls:
        key = tuple(call)
        if key in out or not call:
            continue
        names, view, random = zip(*call)
        try:
            out[key] = align(stats, names, view, random)
        except AmbiguousAlignment as exc:
            raise PlanMismatchError(
                f"module {mp.fqn!r}: under torch.compile ({mode}) op {exc.run_index} is {exc.name}, which could "
                f"be the stats' op {exc.stats_positions}"
                + (" or an op they did not see" if exc.can_be_unseen else "")
                + " and those have different save decisions. Likely cause: compile reorders or adds ops of the "
                  "same name; fix: train this module without compile, or plan it with ac_units leaving it out"
            ) from None
    return list(out.values())

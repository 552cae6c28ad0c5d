"""One-pass stats collector: forward, backward and optimizer step under FakeTensorMode.

The model's parameters, buffers and the example inputs are swapped for fake
tensors (no memory, no compute), one training step runs, and three things
watch it:

* global module hooks give the forward pre/post order and, through
  multi-grad hooks, each module's backward span (modules whose backward hooks
  never fire, e.g. rotary embeddings, simply have no backward span);
* a dispatch mode sees every ATen op: it registers new storages in a
  :class:`StorageBook`, prices the op with the cost model and, in forward,
  appends it to the op list of every active non-leaf module;
* ``saved_tensors_hooks`` record which storages autograd saves;
* a :class:`TimelineRecorder` keeps the instants of most live memory (the
  stats' ``timeline``), with a module's later calls (:mod:`estimators.repeat_calls`).

The op lists skip exactly ``torch.utils.checkpoint.SAC_IGNORED_OPS``, so they
are the sequence a selective-checkpoint policy function sees when the module
runs under ``torch.utils.checkpoint``: :func:`estimators.apply_plan` matches
ops by position and checks their names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from estimators.aten_ops import SAC_IGNORED_OPS, is_inplace_op, is_random_op, is_view_op, op_name
from estimators.assemble import build_stats
from estimators.fake_step import (FakeConverter, fake_loss_fn, fakeify, forward_and_loss, make_optimizer,
                                  optimizer_bytes)
from estimators.model_settings import with_model_settings
from estimators.models import hf_fake_as_real
from estimators.moe import MoeRouting, RoutingMode, one_hot_as_on_device
from estimators.overhead import call_spec, fill_checkpoint_overheads
from estimators.repeat_calls import RepeatCalls
from estimators.timeline import BACKWARD, OPTIMIZER, TimelineRecorder
from estimators.tracking import ACT, BUFFER, GRAD, INPUT, OPT, PARAM, TEMP, StorageBook, storages_of, tensors_in
from planner import Stats, StatsMetadata

__all__ = ["collect_stats", "module_fqns", "OPTIMIZERS"]

OPTIMIZERS = ("adamw", "adam", "sgd", "none")
Progress = Callable[[str, int, int], None]


def module_fqns(model: nn.Module) -> dict[nn.Module, str]:
    """fqn of every submodule, rooted at the model's class name (``Transformer.layers.0``)."""
    root = type(model).__name__
    out: dict[nn.Module, str] = {}
    for name, mod in model.named_modules(remove_duplicate=True):
        out[mod] = f"{root}.{name}" if name else root
    return out


@dataclass
class _Op:
    name: str
    runtime_ms: float
    output_bytes: int
    out_serials: frozenset[int]
    view_like: bool
    random: bool
    inplace: bool
    mutated_serial: int | None


@dataclass
class _Mod:
    fqn: str
    parent: str | None
    is_leaf: bool
    ops: list[int] = field(default_factory=list)  # indices into the global op list
    act_before: int = 0
    act_after: int = 0
    input_bytes: int = 0
    activation_inputs: tuple[tuple[int, int], ...] = ()  # (serial, bytes) of its inputs made in the forward
    keyword_inputs_seen: bool = False
    output_bytes: int = 0
    fw_ms: float = 0.0
    bw_ms: float = 0.0
    temp_start: int = 0
    temp_peak: int = 0
    act_at_peak: int | None = None  # live activations when the backward peak was reached
    grad_total: int | None = None
    bw_state: str = "none"  # none -> open -> closed
    done_fw: bool = False
    ran_inside: tuple[str, ...] = ()  # fqns of the modules running when its first call began
    call: tuple | None = None  # its first call's arguments (tensors as TensorSpecs), when asked for
    recompute_stop: int = 0  # its ops recorded when autograd last saved a tensor in its forward
    calls: int = 0  # forward calls in the step (a shared layer is called once per use)


class _Collector(TorchDispatchMode):
    def __init__(self, book: StorageBook, cost: Callable[..., float], mods: dict[nn.Module, _Mod]):
        super().__init__()
        self.book = book
        self.cost = cost
        self.mods = mods
        self.phase = ACT
        self.ops: list[_Op] = []
        self.fw_stack: list[_Mod] = []
        self.bw_open: list[_Mod] = []
        self.saved: set[int] = set()
        self.timeline = TimelineRecorder(self._running)
        book.on_alloc.append(self._on_alloc)
        book.on_alloc.append(self.timeline.on_alloc)

    def _running(self) -> list[str]:
        # forward: the forward stack; backward: the backward spans still open, the latest last
        return [m.fqn for m in (self.fw_stack if self.phase == ACT else self.bw_open if self.phase == TEMP else ())]

    def _on_alloc(self, category: str, live: dict[str, int]) -> None:
        if category == TEMP:
            for m in self.bw_open:
                if live[TEMP] > m.temp_peak:
                    m.temp_peak, m.act_at_peak = live[TEMP], live[ACT]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        mutated = None
        if is_inplace_op(func) and args and isinstance(args[0], torch.Tensor):
            mutated = self.book.serial(args[0].untyped_storage())
        out = func(*args, **kwargs)
        ms = self.cost(func, args, kwargs, out)
        serials, out_bytes = set(), 0
        for st in storages_of(out):
            serial, _ = self.book.add(st, self.phase)
            serials.add(serial)
            out_bytes += self.book.nbytes(st)
        if self.phase == ACT:
            for m in self.fw_stack:
                m.fw_ms += ms
            if func not in SAC_IGNORED_OPS and self.fw_stack:
                self._record(func, args, kwargs, ms, out_bytes, serials, mutated)
        elif self.phase == TEMP:
            for m in self.bw_open:
                m.bw_ms += ms
        return out

    def _record(self, func, args, kwargs, ms, out_bytes, serials, mutated) -> None:
        # Bytes follow PyTorch's SACEstimator (every output storage of a
        # non-view op) except in-place ops: their storage is their parent's,
        # which carries the bytes, and the two share one decision.
        view = is_view_op(func)
        inplace = is_inplace_op(func) and not view
        idx = len(self.ops)
        self.ops.append(
            _Op(op_name(func), ms, 0 if view or inplace else out_bytes, frozenset(serials), view,
                is_random_op(func, args, kwargs), inplace, mutated)
        )
        for m in self.fw_stack:
            if not m.is_leaf and not m.done_fw:
                m.ops.append(idx)

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if self.phase == ACT:
            # Checkpointing stops its recompute at the last tensor autograd saved in the forward. A saved
            # input is packed before the dispatch mode sees its op (autograd runs above it), an output
            # after: the ops recorded so far are exactly the ops a recompute of each running module runs.
            for m in self.fw_stack:
                if not m.done_fw:
                    m.recompute_stop = len(m.ops)
        if self.phase == ACT and t.layout == torch.strided:
            serial = self.book.serial(t.untyped_storage())
            if serial is not None:
                self.saved.add(serial)
        return t


class _ModuleHooks:
    """Forward pre/post and backward pre/post events of every module of the model."""

    def __init__(self, col: _Collector, book: StorageBook, mods: dict[nn.Module, _Mod], progress: Progress | None,
                 *, capture_calls: bool = False):
        self.col, self.book, self.mods, self.progress = col, book, mods, progress
        self.capture_calls = capture_calls
        self.pre_order: list[str] = []
        self.post_order: list[str] = []
        self._repeat: list[bool] = []
        self._seen: set[str] = set()
        self._handles: list[Any] = []
        self.repeats = RepeatCalls(book, col.timeline)
        # what progress counts toward: containers (ModuleList, ModuleDict) have no forward of their own and never run
        self.runnable = sum(type(mod).forward is not nn.Module.forward for mod in mods)

    def __enter__(self) -> _ModuleHooks:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        self._handles = [
            register_module_forward_pre_hook(self._fw_pre),
            register_module_forward_hook(self._fw_post, always_call=True),
        ]
        # keyword arguments reach only a module's own hooks
        self._handles += [mod.register_forward_pre_hook(self._keyword_inputs, with_kwargs=True)
                          for mod, m in self.mods.items() if not m.is_leaf]
        if self.capture_calls:
            self._handles += [mod.register_forward_pre_hook(self._capture, with_kwargs=True)
                              for mod, m in self.mods.items() if not m.is_leaf]
        return self

    def _keyword_inputs(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """Keyword inputs made in the forward (attention masks), on the first call: checkpointing holds them too."""
        m = self.mods[module]
        if m.keyword_inputs_seen or self.col.phase != ACT:
            return
        m.keyword_inputs_seen = True
        seen = {serial for serial, _ in m.activation_inputs}
        extra = tuple((self.book.serial(s), self.book.nbytes(s)) for s in storages_of(kwargs)
                      if self.book.category(s) == ACT and self.book.serial(s) not in seen)
        m.activation_inputs += extra

    def _capture(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        m = self.mods[module]
        if m.call is None and self.col.phase == ACT:
            m.call = call_spec(args, kwargs)

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()

    def _fw_pre(self, module: nn.Module, args: Any) -> None:
        m = self.mods.get(module)
        if m is None or self.col.phase != ACT:
            return
        first = m.fqn not in self._seen
        m.calls += 1
        self._repeat.append(not first)
        if not first:
            self.repeats.started(m.fqn, m.is_leaf, args)
        if first:
            self._seen.add(m.fqn)
            self.pre_order.append(m.fqn)
            # only modules on their first (recorded) call: a repeat call is described by the first one,
            # so a child first run during its parent's second call did not run inside the recorded parent
            m.ran_inside = tuple(x.fqn for x, rep in zip(self.col.fw_stack, self._repeat) if not rep)
            m.act_before = self.book.live[ACT]
            m.input_bytes = sum(self.book.nbytes(s) for s in storages_of(args))
            m.activation_inputs = tuple((self.book.serial(s), self.book.nbytes(s)) for s in storages_of(args)
                                        if self.book.category(s) == ACT)
            grads = [t for t in tensors_in(args) if t.requires_grad]
            if grads:
                torch.autograd.graph.register_multi_grad_hook(grads, lambda _g, m=m: self._bw_post(m))
        self.col.fw_stack.append(m)

    def _fw_post(self, module: nn.Module, args: Any, output: Any) -> None:
        m = self.mods.get(module)
        if m is None or self.col.phase != ACT or not self.col.fw_stack or self.col.fw_stack[-1] is not m:
            return
        self.col.fw_stack.pop()
        if self._repeat.pop():
            self.repeats.finished(m.fqn, m.is_leaf, max(0, m.act_after - m.act_before - m.output_bytes), output)
            return
        m.done_fw = True
        self.post_order.append(m.fqn)
        self.col.timeline.forward_finished(m.fqn)
        m.act_after = self.book.live[ACT]
        m.output_bytes = sum(self.book.nbytes(s) for s in storages_of(output))
        outs = [t for t in tensors_in(output) if t.requires_grad]
        if outs:
            torch.autograd.graph.register_multi_grad_hook(outs, lambda _g, m=m: self._bw_pre(m), mode="any")
        if self.progress:
            self.progress("forward", len(self.post_order), self.runnable)

    def _bw_pre(self, m: _Mod) -> None:
        if m.bw_state != "none":
            return
        m.bw_state = "open"
        self.col.timeline.backward_started(m.fqn)
        m.temp_start = m.temp_peak = self.book.live[TEMP]
        m.act_at_peak = self.book.live[ACT]
        self.col.bw_open.append(m)

    def _bw_post(self, m: _Mod) -> None:
        if m.bw_state != "open":
            return
        self.close(m)

    def close(self, m: _Mod) -> None:
        m.bw_state = "closed"
        m.grad_total = self.book.live[GRAD]
        if m in self.col.bw_open:
            self.col.bw_open.remove(m)
        if self.progress:
            self.progress("backward", sum(x.bw_state == "closed" for x in self.mods.values()), self.runnable)


def collect_stats(
    model: nn.Module,
    inputs: Any,
    *,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    optimizer: str = "adamw",
    optimizer_foreach: bool | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    cost_model: Callable[..., float],
    emulate_cuda_attention: bool = False,
    round_bytes_to: int = 1,
    checkpoint_overhead_us_per_op: float | None = None,
    measure_checkpoint_overhead: bool = False,
    metadata: StatsMetadata | None = None,
    moe_routing: MoeRouting | None = None,
    progress: Progress | None = None,
) -> Stats:
    """Stats v1 of one training step of ``model`` on ``inputs``, collected under FakeTensorMode.

    The model may live on any device, ``meta`` included; its parameters and
    buffers are replaced by fake tensors on ``device`` (cast to ``dtype`` if
    given) for the duration of the call and restored afterwards.
    ``optimizer_foreach`` picks the optimizer's multi-tensor implementation
    (None: PyTorch's default on ``device``, foreach on CUDA only).
    ``cost_model(func, args, kwargs, out) -> ms`` prices each op.
    ``emulate_cuda_attention`` routes attention to CUDA's kernels (see
    :mod:`estimators.emulation`). ``round_bytes_to`` rounds every storage up
    (512 mimics the CUDA caching allocator). Each module's
    ``checkpoint_overhead_ms`` is its op count times
    ``checkpoint_overhead_us_per_op``, or, with ``measure_checkpoint_overhead``,
    measured on real tensors on ``device`` (see :mod:`estimators.overhead`);
    null with neither. ``moe_routing`` is the routing assumed for
    mixture-of-experts layers (default balanced, see :mod:`estimators.moe`);
    when the model routed tokens it is recorded in the metadata's
    ``model_settings``.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    device = torch.device(device)
    fqns = module_fqns(model)
    parents: dict[str, str | None] = {}
    for mod, fqn in fqns.items():
        for name, child in mod.named_children():
            parents.setdefault(fqns[child], fqn)
    mods = {mod: _Mod(fqn, parents.get(fqn), not any(True for _ in mod.children())) for mod, fqn in fqns.items()}

    fake = FakeTensorMode(allow_non_fake_inputs=False)
    book = StorageBook(round_bytes_to)
    convert = FakeConverter(fake, device, dtype)
    restores = [fakeify(model, convert)]
    try:
        params = [p for p in model.parameters() if p.requires_grad]
        fake_in = convert.tree(inputs)
        fake_loss, restore_loss = fake_loss_fn(loss_fn, convert)
        restores.append(restore_loss)
        for p in model.parameters():
            book.add_tensors([p], PARAM)
        book.add_tensors(model.buffers(), BUFFER)
        book.add_tensors(tensors_in(fake_in) + list(convert.memo.values()), INPUT)  # with what loss_fn captured
        for p in params:
            p.register_post_accumulate_grad_hook(lambda q: book.recategorize(q.grad.untyped_storage(), GRAD))
        col = _Collector(book, cost_model, mods)
        emulation = _emulation(emulate_cuda_attention)
        routing = RoutingMode(moe_routing or MoeRouting())
        hooks = _ModuleHooks(col, book, mods, progress, capture_calls=measure_checkpoint_overhead)
        with fake, routing, col, hooks:
            with (torch.autograd.graph.saved_tensors_hooks(col.pack, lambda t: t), emulation,
                  hf_fake_as_real(model), one_hot_as_on_device()):
                output, loss = forward_and_loss(model, fake_in, fake_loss, loss_fn)
            del output  # as a training loop does: `loss = model(**batch).loss; loss.backward()`
            col.phase = TEMP
            col.timeline.enter(BACKWARD)
            loss.backward()
            del loss
            for m in mods.values():
                if m.bw_state == "open":
                    hooks.close(m)
            col.phase = OPT
            col.timeline.enter(OPTIMIZER)
            foreach = device.type == "cuda" if optimizer_foreach is None else optimizer_foreach
            opt = make_optimizer(optimizer, params, foreach=foreach)
            if opt is not None:
                opt.step()
                if progress:
                    progress("optimizer", 1, 1)
            opt_bytes = optimizer_bytes(opt, book)
        stats = build_stats(model, mods, col, hooks, opt_bytes, book, with_model_settings(metadata, model))
        stats.metadata.model_settings.update(routing.settings(model))
    finally:
        for restore in reversed(restores):
            restore()
    if checkpoint_overhead_us_per_op is not None or measure_checkpoint_overhead:
        fill_checkpoint_overheads(stats, {m.fqn: mod for mod, m in mods.items()},
                                  {m.fqn: m.call for m in mods.values() if m.call is not None},
                                  us_per_op=checkpoint_overhead_us_per_op, measure=measure_checkpoint_overhead,
                                  device=device, dtype=dtype, progress=progress)
    if emulate_cuda_attention:
        stats.metadata.tags["attention_kernels"] = ",".join(f"{k}:{v}" for k, v in sorted(emulation.kernels.items()))
    return stats


def _emulation(enabled: bool) -> Any:
    from contextlib import nullcontext

    from estimators.emulation import CudaAttentionEmulation
    return CudaAttentionEmulation() if enabled else nullcontext()

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
  stats' ``timeline``), with a module's later calls (:mod:`estimators.collect.repeat_calls`).

Beneath them, :class:`~estimators.collect.input_values.InputValues` follows
the batch's values through the forward (inputs made on the CPU keep them),
so model code that branches on the batch takes the real batch's path; the
reads it answered are tagged ``batch_values_read``. The step runs with every
Hugging Face ``use_cache`` off, as training and ``apply_plan`` run it.

The op lists skip exactly ``torch.utils.checkpoint.SAC_IGNORED_OPS``, so they
are the sequence a selective-checkpoint policy function sees when the module
runs under ``torch.utils.checkpoint``: :func:`estimators.apply_plan` matches
ops by position and checks their names.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from estimators.collect.assemble import build_stats
from estimators.collect.fake_step import FakeConverter, fake_loss_fn, fakeify, forward_and_loss, optimizer_bytes
from estimators.collect.fsdp import ShardedStep, fake_process_group, is_collective_op, meta_copy
from estimators.collect.input_values import InputValues, unanswered_read_error
from estimators.collect.models import hf_fake_as_real
from estimators.collect.module_hooks import ModuleHooks
from estimators.collect.moe import MoeRouting, RoutingMode, one_hot_as_on_device
from estimators.collect.overhead import fill_checkpoint_overheads
from estimators.collect.settings_record import with_model_settings
from estimators.collect.timeline import BACKWARD, OPTIMIZER, TimelineRecorder
from estimators.common import (ACT, BATCH_VALUES_TAG, BUFFER, COMM, GRAD, INPUT, OPT, PARAM, SAC_IGNORED_OPS, TEMP,
                               UNKNOWN_VALUES_TAG, FsdpSetup, StorageBook, default_units, is_inplace_op, is_random_op,
                               is_view_op, make_optimizer, module_fqns, op_name, shard_model, storages_of,
                               switch_off_kv_cache, tensors_in, unit_fqns)
from planner import Sharding, Stats, StatsMetadata

__all__ = ["collect_stats", "OPTIMIZERS"]

OPTIMIZERS = ("adamw", "adam", "sgd", "none")
Progress = Callable[[str, int, int], None]


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
    fresh: bool = True  # every output storage is new (False: an alias op such as _unsafe_view, or in-place)


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
    out_serials: frozenset[int] = frozenset()  # its first call's output storages
    # per later call: its inputs made in the forward ({serial: bytes}) and its output storages
    later_calls: list[tuple[dict[int, int], frozenset[int]]] = field(default_factory=list)


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
        self.sharded: ShardedStep | None = None  # set for an FSDP2 step: its hook windows
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
        if self.sharded is not None and (self.sharded.busy or is_collective_op(func)):
            return self._collective(func, args, kwargs)
        mutated = None
        if self.phase == ACT and is_inplace_op(func) and args and isinstance(args[0], torch.Tensor):
            mutated = self.book.serial(args[0].untyped_storage())
        out = func(*args, **kwargs)
        ms = self.cost(func, args, kwargs, out)
        serials, out_bytes, fresh = set(), 0, True
        for st in storages_of(out):
            serial, new = self.book.add(st, self.phase)
            serials.add(serial)
            out_bytes += self.book.nbytes(st)
            fresh = fresh and new
        if self.phase == ACT:
            for m in self.fw_stack:
                m.fw_ms += ms
            if func not in SAC_IGNORED_OPS and self.fw_stack:
                self._record(func, args, kwargs, ms, out_bytes, serials, mutated, fresh)
        elif self.phase == TEMP:
            for m in self.bw_open:
                m.bw_ms += ms
        return out

    def _collective(self, func, args, kwargs):
        """FSDP2's communication (see :mod:`estimators.collect.fsdp`): booked as such, no module's op, no compute time."""
        out = func(*args, **kwargs)
        for st in storages_of(out):
            self.book.add(st, COMM)
        if "reduce_scatter" in func.__name__ and args:  # its output holds the unit's sharded gradients
            for st in storages_of(args[0]):
                self.book.recategorize(st, GRAD)
        for st in storages_of(kwargs.get("out")):  # FSDP2's copy-in/copy-out buffers
            if self.book.category(st) in (ACT, TEMP):
                self.book.recategorize(st, COMM)
        return out

    def _record(self, func, args, kwargs, ms, out_bytes, serials, mutated, fresh) -> None:
        # Bytes follow PyTorch's SACEstimator (every output storage of a
        # non-view op) except in-place ops: their storage is their parent's,
        # which carries the bytes, and the two share one decision.
        view = is_view_op(func)
        inplace = is_inplace_op(func) and not view
        idx = len(self.ops)
        self.ops.append(
            _Op(op_name(func), ms, 0 if view or inplace else out_bytes, frozenset(serials), view,
                is_random_op(func, args, kwargs), inplace, mutated, fresh)
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
    fsdp: FsdpSetup | None = None,
) -> Stats:
    """Stats v1 of one training step of ``model`` on ``inputs``, collected under FakeTensorMode.

    The model may live on any device, ``meta`` included; its parameters and
    buffers are replaced by fake tensors on ``device`` (cast to ``dtype`` if
    given) for the duration of the call and restored afterwards. ``inputs``
    (and the tensors ``loss_fn`` captures) made with real values, on the CPU,
    lend them to their fakes: model code that branches on the batch takes
    its path (:mod:`estimators.collect.input_values`); inputs on ``meta``
    have no values.
    ``optimizer_foreach`` picks the optimizer's multi-tensor implementation
    (None: PyTorch's default on ``device``, foreach on CUDA only).
    ``cost_model(func, args, kwargs, out) -> ms`` prices each op.
    ``emulate_cuda_attention`` routes attention to CUDA's kernels (see
    :mod:`estimators.collect.emulation`). ``round_bytes_to`` rounds every storage up
    (512 mimics the CUDA caching allocator). Each module's
    ``checkpoint_overhead_ms`` is its op count times
    ``checkpoint_overhead_us_per_op``, or, with ``measure_checkpoint_overhead``,
    measured on real tensors on ``device`` (see :mod:`estimators.collect.overhead`);
    null with neither. ``moe_routing`` is the routing assumed for
    mixture-of-experts layers (default balanced, see :mod:`estimators.collect.moe`);
    when the model routed tokens it is recorded in the metadata's
    ``model_settings``. ``fsdp`` collects one rank of an FSDP2 job
    (:mod:`estimators.collect.fsdp`): the step runs on a sharded copy of the model
    under a fake process group, and the stats record the sharding.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    device = torch.device(device)
    step_model, fqns, units = model, module_fqns(model), None
    if fsdp is not None and fsdp.mixed_precision and dtype not in (None, torch.float32):
        raise ValueError(f"mixed_precision {fsdp.mixed_precision!r} keeps fp32 sharded parameters and casts them "
                         f"itself: dtype must be None or torch.float32, got {dtype}")
    if fsdp is not None:  # the step runs on a sharded copy; the fqns are the model's own
        units = unit_fqns(model, fsdp.wrap if fsdp.wrap is not None else default_units(model), fqns)
        step_model = meta_copy(model)
        fqns = module_fqns(step_model, root=type(model).__name__)
    parents: dict[str, str | None] = {}
    for mod, fqn in fqns.items():
        for name, child in mod.named_children():
            parents.setdefault(fqns[child], fqn)
    mods = {mod: _Mod(fqn, parents.get(fqn), not any(True for _ in mod.children())) for mod, fqn in fqns.items()}
    step = _Step(step_model, mods, cost_model, round_bytes_to, progress, measure_checkpoint_overhead)
    with ExitStack() as stack:
        for m in {id(model): model, id(step_model): step_model}.values():
            for config in switch_off_kv_cache(m):  # as training (and apply_plan) runs it; given back after
                stack.callback(setattr, config, "use_cache", True)
        if fsdp is not None:
            step.shard(fsdp, units, stack.enter_context(fake_process_group(fsdp.world_size, device.type)))
        emulation = _emulation(emulate_cuda_attention)
        stats = step.run(inputs, loss_fn, optimizer, optimizer_foreach, device, dtype, emulation, moe_routing,
                         with_model_settings(metadata, model))
    if fsdp is not None:
        kept = {m.fqn for m in stats.modules}  # a unit run out of place is not in the stats (nor planned)
        stats.metadata.sharding = Sharding(kind="fsdp2", world_size=fsdp.world_size,
                                           units=[u for u in units if u in kept],
                                           mixed_precision=fsdp.mixed_precision,
                                           reshard_after_forward=fsdp.reshard_after_forward)
    if checkpoint_overhead_us_per_op is not None or measure_checkpoint_overhead:
        fill_checkpoint_overheads(stats, {fqn: mod for mod, fqn in module_fqns(model).items()},  # the model's own
                                  {m.fqn: m.call for m in mods.values() if m.call is not None},
                                  us_per_op=checkpoint_overhead_us_per_op, measure=measure_checkpoint_overhead,
                                  device=device, dtype=dtype, progress=progress)
    if emulate_cuda_attention:
        stats.metadata.tags["attention_kernels"] = ",".join(f"{k}:{v}" for k, v in sorted(emulation.kernels.items()))
    return stats


class _Step:
    """The fake training step of one collection: the model made fake (and sharded), run, turned into stats."""

    def __init__(self, model: nn.Module, mods: dict[nn.Module, _Mod], cost_model: Callable[..., float],
                 round_bytes_to: int, progress: Progress | None, capture_calls: bool):
        self.model, self.mods, self.progress = model, mods, progress
        self.fake = FakeTensorMode(allow_non_fake_inputs=False)
        self.book = StorageBook(round_bytes_to)
        self.col = _Collector(self.book, cost_model, mods)
        self.hooks = ModuleHooks(self.col, self.book, mods, progress, capture_calls=capture_calls)
        self.values = InputValues()
        self.setup: FsdpSetup | None = None
        self.units: list[str] = []
        self.mesh: Any = None

    def shard(self, setup: FsdpSetup, units: list[str], mesh: Any) -> None:
        """Run the step sharded: ``fully_shard`` the (copied) model's ``units`` over ``mesh`` once it is fake."""
        self.setup, self.units, self.mesh = setup, units, mesh

    def run(self, inputs: Any, loss_fn: Any, optimizer: str, optimizer_foreach: bool | None, device: torch.device,
            dtype: torch.dtype | None, emulation: Any, moe_routing: MoeRouting | None,
            metadata: StatsMetadata | None) -> Stats:
        model, book, col, hooks, fake = self.model, self.book, self.col, self.hooks, self.fake
        convert = FakeConverter(fake, device, dtype)
        restores = []
        try:
            if self.setup is not None:
                restores.append(fakeify(model, FakeConverter(fake, device, dtype)))  # the copy's fakes: not inputs
                with fake:
                    shard_model(model, self.setup, self.mesh, self.units, {m: x.fqn for m, x in self.mods.items()})
                col.sharded = ShardedStep(book, [m for m, x in self.mods.items() if x.fqn in self.units])
            else:
                restores.append(fakeify(model, convert))
            params = [p for p in model.parameters() if p.requires_grad]
            fake_in = convert.tree(inputs, keep_values=True)
            fake_loss, restore_loss = fake_loss_fn(loss_fn, convert)
            restores.append(restore_loss)
            for p in model.parameters():
                book.add_tensors([p], PARAM)
            book.add_tensors(model.buffers(), BUFFER)
            book.add_tensors(tensors_in(fake_in) + list(convert.memo.values()), INPUT)  # with what loss_fn captured
            for p in params:
                p.register_post_accumulate_grad_hook(lambda q: book.recategorize_all(storages_of(q.grad), GRAD))
            routing = RoutingMode(moe_routing or MoeRouting())
            with fake, self.values, routing, col, hooks, col.sharded or nullcontext():
                opt_bytes = self._forward_backward_step(fake_in, fake_loss, loss_fn, emulation, optimizer,
                                                        optimizer_foreach, device, params)
            stats = build_stats(model, self.mods, col, hooks, opt_bytes, book, metadata)
            stats.metadata.model_settings.update(routing.settings(model))
            if self.values.reads:  # the stats follow this batch's path through the model's data-dependent code
                stats.metadata.tags[BATCH_VALUES_TAG] = _counted(self.values.reads)
            if self.values.unknown:  # it asked about values the batch did not have (made on meta)
                stats.metadata.tags[UNKNOWN_VALUES_TAG] = _counted(self.values.unknown)
        finally:
            for restore in reversed(restores):
                restore()
        return stats

    def _forward_backward_step(self, fake_in: Any, fake_loss: Any, loss_fn: Any, emulation: Any, optimizer: str,
                               optimizer_foreach: bool | None, device: torch.device,
                               params: list[nn.Parameter]) -> dict[int, int]:
        model, col, hooks = self.model, self.col, self.hooks
        self.values.active = True  # the batch's (and an assumed MoE routing's) values, forward and backward
        try:
            with (torch.autograd.graph.saved_tensors_hooks(col.pack, lambda t: t), emulation,
                  hf_fake_as_real(model, self.values), one_hot_as_on_device()):
                output, loss = forward_and_loss(model, fake_in, fake_loss, loss_fn)
            del output  # as a training loop does: `loss = model(**batch).loss; loss.backward()`
            col.phase = TEMP
            col.timeline.enter(BACKWARD)
            loss.backward()
            del loss
        except Exception as exc:
            clear = unanswered_read_error(exc, self.values)
            if clear is None:
                raise
            raise clear from None
        finally:
            self.values.active = False
        if col.sharded is not None:
            col.sharded.book_grads(params)
        for m in self.mods.values():
            if m.bw_state == "open":
                hooks.close(m)
        col.phase = OPT
        col.timeline.enter(OPTIMIZER)
        foreach = device.type == "cuda" if optimizer_foreach is None else optimizer_foreach
        opt = make_optimizer(optimizer, params, foreach=foreach)
        if opt is not None:
            opt.step()
            if self.progress:
                self.progress("optimizer", 1, 1)
        return optimizer_bytes(opt, self.book)


def _counted(names: list[str]) -> str:
    """``aten.all x2, aten._local_scalar_dense x2``: each name once, in order of first appearance."""
    counts = {n: names.count(n) for n in dict.fromkeys(names)}
    return ", ".join(f"{n} x{c}" for n, c in counts.items())


def _emulation(enabled: bool) -> Any:
    from estimators.collect.emulation import CudaAttentionEmulation
    return CudaAttentionEmulation() if enabled else nullcontext()

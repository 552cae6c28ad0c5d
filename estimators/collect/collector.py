"""One-pass stats collector: forward, backward and optimizer step under FakeTensorMode.

The model's parameters, buffers and the example inputs are swapped for fake tensors (no memory, no compute),
one training step runs, and three things watch it:

* global module hooks give the forward pre/post order and, through multi-grad hooks, each module's backward
  span (modules whose backward hooks never fire, e.g. rotary embeddings, simply have no backward span);
* a dispatch mode sees every ATen op: it registers new storages in a :class:`StorageBook`, prices the op with
  the cost model and, in forward, appends it to the op list of every active non-leaf module;
* ``saved_tensors_hooks`` record which storages autograd saves;
* a :class:`TimelineRecorder` keeps the instants of most live memory (the
  stats' ``timeline``), with a module's later calls (:mod:`estimators.collect.repeat_calls`).

Beneath them, :class:`~estimators.collect.input_values.InputValues` follows the batch's values through the
forward (inputs made on the CPU keep them), so model code that branches on the batch takes the real batch's
path; the reads it answered are tagged ``batch_values_read``. The step runs with every Hugging Face
``use_cache`` off, as training and ``apply_plan`` run it.

The op lists skip exactly ``torch.utils.checkpoint.SAC_IGNORED_OPS``, so they are the sequence a
selective-checkpoint policy function sees when the module runs under ``torch.utils.checkpoint``:
:func:`estimators.apply_plan` matches ops by position and checks their names.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from estimators.collect.assemble import build_stats
from estimators.collect import compile_probe, compiled_stats
from estimators.collect.fake_step import (FakeConverter, eager_loss, fake_loss_fn, fakeify, forward_and_loss,
                                         optimizer_bytes, traced_ops, with_zero_gradients)
from estimators.collect.emulation import attention_emulation
from estimators.collect.fsdp import (ShardedStep, fake_process_group, is_collective_op, record_sharding,
                                    run_collective, run_op)
from estimators.collect.tensor_parallel import (is_seeded_op, job_parallelism, parallelize_step, step_copy,
                                                stats_op_name)
from estimators.collect.input_values import InputValues, tag_batch_values, unanswered_read_error
from estimators.collect.models import hf_fake_as_real
from estimators.collect.module_hooks import ModuleHooks
from estimators.collect.moe import MoeRouting, RoutingMode, one_hot_as_on_device
from estimators.collect.overhead import fill_checkpoint_overheads
from estimators.collect.recompute_life import RecomputeLife
from estimators.collect.records import ModuleRecord, OpRecord
from estimators.collect.settings_record import with_model_settings
from estimators.collect.step_loop import (check_step_options, describe_loop, is_cached_cast, optimizer_name,
                                          scalar_stand_in, scratch_ops, scratch_records)
from estimators.collect.timeline import BACKWARD, FORWARD, OPTIMIZER, TimelineRecorder
from estimators.collect.unsaved_forward import ForwardLive, record_unsaved_lives
from estimators.common import (ACT, BUFFER, GRAD, INPUT, OPT, PARAM, SAC_IGNORED_OPS, TEMP, FsdpSetup, ParallelDims,
                               StorageBook, TrainingLoop, is_inplace_op, is_random_op, is_view_op,
                               local_shards, make_optimizer, module_fqns, storages_of, switch_off_kv_cache,
                               tensors_in)
from planner import MUST_SAVE_OPS, Stats, StatsMetadata

__all__ = ["collect_stats", "OPTIMIZERS"]

OPTIMIZERS = ("adamw", "adam", "sgd", "none")  # the built-in names; any dotted class path works too
Progress = Callable[[str, int, int], None]


class _Collector(TorchDispatchMode):
    def __init__(self, book: StorageBook, cost: Callable[..., float], mods: dict[nn.Module, ModuleRecord]):
        super().__init__()
        self.book = book
        self.cost = cost
        self.mods = mods
        self.phase = ACT
        self.ops: list[OpRecord] = []
        self.fw_stack: list[ModuleRecord] = []
        self.bw_open: list[ModuleRecord] = []
        self.saved: set[int] = set()
        self.saved_in: dict[int, set[str]] = {}  # serial -> the modules whose forward ops saved it
        self.life = RecomputeLife()  # forward storages' lives, each module's first unpack
        self.sharded: ShardedStep | None = None  # set for an FSDP2 or TP step: FSDP2's hook windows
        self.tp = False  # a tensor-parallel step: collectives in a module's forward are its ops
        self.under_autocast: str | None = None  # autocast's dtype when the innermost running module began or ended
        self.autocast_seen: str | None = None  # autocast's dtype at any non-leaf module's forward
        self.timeline = TimelineRecorder(self._running)
        self.fw_live = ForwardLive()  # forward_live_bytes
        book.on_alloc.append(self.fw_live.on_alloc)
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
            if not (self.tp and self.phase == ACT and self.fw_stack and not self.sharded.busy):
                return run_collective(self.book, func, args, kwargs)
            # tensor parallel's collectives inside a module: ops of the module, never recomputed (must_save)
        if self.phase == OPT and func is torch.ops.aten._local_scalar_dense.default:
            return scalar_stand_in(func, args[0])  # a value the optimizer step reads, if fake mode knows none
        mutated = None
        if self.phase == ACT and is_inplace_op(func) and args and isinstance(args[0], torch.Tensor):
            mutated = self.book.serial(storages_of(args[0])[0])
        out = run_op(func, args, kwargs)
        ms = self.cost(func, *local_shards((args, kwargs, out)))
        serials, out_bytes, fresh, made = set(), 0, True, []
        for st in storages_of(out):
            serial, new = self.book.add(st, self.phase)
            serials.add(serial)
            out_bytes += self.book.nbytes(st)
            fresh = fresh and new
            if new and self.phase == ACT:
                made.append((serial, self.book.nbytes(st)))
                self.life.watch(st, serial, self)
        if self.phase == ACT:
            for m in self.fw_stack:
                m.fw_ms += ms
            if func not in SAC_IGNORED_OPS and self.fw_stack:
                cast = self.under_autocast is not None and is_cached_cast(func, args, out)
                self._record(func, args, kwargs, ms, out_bytes, serials, mutated, fresh, cast, tuple(made))
        elif self.phase == TEMP:
            for m in self.bw_open:
                m.bw_ms += ms
        return out

    def _record(self, func, args, kwargs, ms, out_bytes, serials, mutated, fresh, cast, made) -> None:
        # Bytes follow PyTorch's SACEstimator (every output storage of a non-view op) except in-place ops: their
        # storage is their parent's, which carries the bytes, and the two share one decision.
        view = is_view_op(func)
        inplace = is_inplace_op(func) and not view
        # a compiled step's (aot_eager: TP is compiled with no other backend) ops as AOTAutograd traces them
        idx, name = len(self.ops), stats_op_name(func, self.life.compiled)
        random = is_random_op(func, args, kwargs) or (self.life.compiled and self.tp and is_seeded_op(func))
        self.ops.append(OpRecord(name, ms, 0 if view or inplace else out_bytes, frozenset(serials), view, random,
                                 inplace, mutated, fresh, cast, made, must_save=name in MUST_SAVE_OPS,
                                 fw_count=self.timeline.position()[1], fw_live=self.fw_live.take(self.book.live)))
        self.life.taken(self, (args, kwargs), idx)
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
        fqns = tuple(m.fqn for m in self.fw_stack if not m.done_fw and not m.is_leaf) if self.phase == ACT else ()
        if self.phase == ACT and t.layout == torch.strided:
            serial = self.book.serial(storages_of(t)[0])
            if serial is not None:
                self.saved.add(serial)
                self.saved_in.setdefault(serial, set()).update(fqns)
        return t, fqns


def collect_stats(
    model: nn.Module,
    inputs: Any,
    *,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    optimizer: str | Callable[[list[nn.Parameter]], torch.optim.Optimizer] = "adamw",
    optimizer_kwargs: dict[str, Any] | None = None,
    optimizer_foreach: bool | None = None,
    grad_accumulation: int = 1,
    autocast: str | None = None,
    grad_scaler: bool = False,
    max_grad_norm: float | None = None,
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
    compile_backend: str | None = None,
    parallel: ParallelDims | None = None,
) -> Stats:
    """Stats v1 of one training step of ``model`` on ``inputs``, collected under FakeTensorMode.

    The model may live on any device, ``meta`` included; its parameters and
    buffers are replaced by fake tensors on ``device`` (cast to ``dtype`` if
    given) for the duration of the call and restored afterwards. ``inputs``
    (and the tensors ``loss_fn`` captures) made with real values, on the CPU,
    lend them to their fakes: model code that branches on the batch takes
    its path (:mod:`estimators.collect.input_values`); inputs on ``meta``
    have no values.
    ``optimizer``: a name of ``OPTIMIZERS`` (torch's classes at their
    defaults), a dotted class path built with ``optimizer_kwargs``, or
    ``optimizer_fn(params)`` (given fake parameters); ``optimizer_foreach``
    its multi-tensor implementation where the class takes one and the kwargs
    do not (None: PyTorch's default on ``device``, foreach on CUDA only).
    The loop (:class:`estimators.common.TrainingLoop`, recorded in the
    metadata): ``grad_accumulation`` micro-batches of ``inputs``, forward and
    loss under ``torch.autocast`` (``bf16``/``fp16``; weights stay in
    ``dtype``), a ``GradScaler``, clipping to ``max_grad_norm``.
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
    ``compile_backend`` (``aot_eager`` or ``inductor``): the step the stats
    describe is the model compiled whole with ``torch.compile(model,
    backend=...)`` (see :mod:`estimators.collect.fake_step`), recorded in the
    metadata's ``model_settings``.
    ``parallel`` (a ``ParallelDims``, in place of ``fsdp``): one rank of a TP
    job, FSDP2 over it or not (:mod:`estimators.collect.tensor_parallel`).
    """
    parallel, fsdp = job_parallelism(fsdp, parallel, compile_backend)
    loop = TrainingLoop(grad_accumulation, autocast, grad_scaler, max_grad_norm)
    check_step_options(optimizer, optimizer_kwargs, autocast, fsdp, dtype, compile_backend)
    device = torch.device(device)
    step_model, fqns, units = step_copy(model, parallel)
    parents: dict[str, str | None] = {}
    for mod, fqn in fqns.items():
        for name, child in mod.named_children():
            parents.setdefault(fqns[child], fqn)
    mods = {mod: ModuleRecord(fqn, parents.get(fqn), not any(True for _ in mod.children())) for mod, fqn in fqns.items()}
    step = _Step(step_model, mods, cost_model, round_bytes_to, progress, measure_checkpoint_overhead)
    step.compile_backend, step.col.life.compiled = compile_backend, compile_backend == "aot_eager"
    with ExitStack() as stack:
        for m in {id(model): model, id(step_model): step_model}.values():
            for config in switch_off_kv_cache(m):  # as training (and apply_plan) runs it; given back after
                stack.callback(setattr, config, "use_cache", True)
        if parallel is not None:
            step.shard(parallel, units, stack.enter_context(fake_process_group(parallel.stage_world_size, device.type, parallel)))
        emulation = attention_emulation(emulate_cuda_attention)
        stats = step.run(inputs, loss_fn, (optimizer, optimizer_kwargs, optimizer_foreach, loop), device, dtype,
                         emulation, moe_routing, describe_loop(with_model_settings(metadata, model), optimizer,
                                                               optimizer_kwargs, loop))
    if compile_backend is not None:
        compiled_stats.mark_compiled(stats, compile_backend, step.probe)
    if parallel is not None:
        record_sharding(stats, fsdp, units, parallel, step.tp_plan)
    if checkpoint_overhead_us_per_op is not None or measure_checkpoint_overhead:
        fill_checkpoint_overheads(stats, {fqn: mod for mod, fqn in module_fqns(model).items()},  # the model's own
                                  {m.fqn: m.call for m in mods.values() if m.call is not None},
                                  us_per_op=checkpoint_overhead_us_per_op, measure=measure_checkpoint_overhead,
                                  device=device, dtype=dtype, progress=progress)
    if not isinstance(optimizer, str) and stats.metadata.optimizer is None:
        stats.metadata.optimizer = optimizer_name(optimizer, step.optimizer_built)
    if emulate_cuda_attention:
        stats.metadata.tags["attention_kernels"] = ",".join(f"{k}:{v}" for k, v in sorted(emulation.kernels.items()))
    return stats


class _Step:
    """The fake training step of one collection: the model made fake (and sharded), run, turned into stats."""

    def __init__(self, model: nn.Module, mods: dict[nn.Module, ModuleRecord], cost_model: Callable[..., float],
                 round_bytes_to: int, progress: Progress | None, capture_calls: bool):
        self.model, self.mods, self.progress = model, mods, progress
        self.fake = FakeTensorMode(allow_non_fake_inputs=False)
        self.book = StorageBook(round_bytes_to)
        self.col = _Collector(self.book, cost_model, mods)
        self.hooks = ModuleHooks(self.col, self.book, mods, progress, capture_calls=capture_calls)
        self.values = InputValues()
        self.setup: ParallelDims | None = None
        self.units: list[str] = []
        self.mesh: Any = None
        self.tp_plan: str | None = None  # what tensor parallel applied
        self.optimizer_built: torch.optim.Optimizer | None = None
        self.compile_backend: str | None = None  # the step runs compiled whole
        self.probe: compile_probe.CompiledProbe | None = None  # what the compiled step on the fake model showed

    def shard(self, setup: ParallelDims, units: list[str], mesh: Any) -> None:
        """Run the step parallelized: TP over ``mesh``'s ``tp`` dimension, then ``fully_shard`` the (copied)
        model's ``units`` over its FSDP dimension (the whole mesh when it is 1-D), once the model is fake."""
        self.setup, self.units, self.mesh = setup, units, mesh

    def run(self, inputs: Any, loss_fn: Any, training: tuple, device: torch.device, dtype: torch.dtype | None,
            emulation: Any, moe_routing: MoeRouting | None, metadata: StatsMetadata | None) -> Stats:
        """``training``: (optimizer, its kwargs, foreach, the TrainingLoop)."""
        model, book, col, hooks, fake = self.model, self.book, self.col, self.hooks, self.fake
        convert = FakeConverter(fake, device, dtype)
        restores = []
        try:
            if self.setup is not None:
                restores.append(fakeify(model, FakeConverter(fake, device, dtype)))  # the copy's fakes: not inputs
                self.tp_plan = parallelize_step(model, self.setup, self.mesh, self.units,
                                                {m: x.fqn for m, x in self.mods.items()}, fake)
                col.tp = self.setup.tp_enabled
                col.sharded = ShardedStep(book, [m for m, x in self.mods.items() if x.fqn in self.units])
            else:
                restores.append(fakeify(model, convert))
            params = [p for p in model.parameters() if p.requires_grad]
            fake_in = convert.tree(inputs, keep_values=True)
            fake_loss, restore_loss = fake_loss_fn(loss_fn, convert)
            restores.append(restore_loss)
            if self.compile_backend is not None:
                with fake:
                    self.probe = compile_probe.zero_gradient_outputs(
                        model, lambda m: forward_and_loss(m, fake_in, fake_loss, loss_fn)[1], self.compile_backend)
            book.add_tensors(list(model.parameters()), PARAM)
            book.add_tensors(model.buffers(), BUFFER)
            book.add_tensors(tensors_in(fake_in) + list(convert.memo.values()), INPUT)  # with what loss_fn captured
            for p in params:
                p.register_post_accumulate_grad_hook(lambda q: book.recategorize_all(storages_of(q.grad), GRAD))
            routing = RoutingMode(moe_routing or MoeRouting())
            with fake, self.values, routing, col, col.sharded or nullcontext():
                opt_bytes = self._training_step(fake_in, fake_loss, loss_fn, emulation, training, device, params)
            if self.probe is not None:  # after the step: a forward more before it would change the step's ops
                with fake, traced_ops():
                    self.probe.count_eager(model, lambda m: eager_loss(m, fake_in, fake_loss, loss_fn))
            stats = build_stats(model, self.mods, col, hooks, opt_bytes, book, metadata)
            stats.metadata.model_settings.update(routing.settings(model))
            tag_batch_values(stats, self.values)
            if col.autocast_seen and "autocast" not in stats.metadata.model_settings:  # turned on inside the model
                stats.metadata.model_settings["autocast"] = col.autocast_seen
        finally:
            for restore in reversed(restores):
                restore()
        return stats

    def _training_step(self, fake_in: Any, fake_loss: Any, loss_fn: Any, emulation: Any, training: tuple,
                       device: torch.device, params: list[nn.Parameter]) -> dict[int, int]:
        """Every micro-batch's forward and backward, then the optimizer step, as the loop runs them."""
        optimizer, optimizer_kwargs, optimizer_foreach, loop = training
        col = self.col
        scaler = loop.grad_scaler_for(device.type)
        kernels = None
        for k in range(1, loop.grad_accumulation + 1):
            if loop.grad_accumulation > 1:
                col.timeline.start_micro_batch(k)
            fsdp = self.setup.fsdp if self.setup is not None else None
            if fsdp is not None and not fsdp.sync_every_micro_batch:
                self.model.set_requires_gradient_sync(k == loop.grad_accumulation)
            # the first micro-batch describes the modules; the others only add their moments
            hooks = self.hooks if k == 1 else ModuleHooks(col, self.book, scratch_records(self.mods), None)
            with hooks, scratch_ops(col) if k > 1 else nullcontext():
                self._micro_batch(hooks, fake_in, fake_loss, loss_fn, emulation, loop, scaler, device, params)
            kernels = kernels if kernels is not None else dict(getattr(emulation, "kernels", {}))
        if hasattr(emulation, "kernels"):
            emulation.kernels = kernels  # one micro-batch's kernels
        record_unsaved_lives(self, fake_in, fake_loss, loss_fn, emulation, loop, device)  # deaths, nothing saved
        col.phase = OPT
        col.timeline.enter(OPTIMIZER)
        foreach = device.type == "cuda" if optimizer_foreach is None else optimizer_foreach
        opt = make_optimizer(optimizer, params, foreach=foreach, kwargs=optimizer_kwargs)
        loop.optimizer_step(opt, params, scaler)
        if opt is not None and self.progress:
            self.progress("optimizer", 1, 1)
        self.optimizer_built = opt
        return optimizer_bytes(opt, self.book)

    def _micro_batch(self, hooks: ModuleHooks, fake_in: Any, fake_loss: Any, loss_fn: Any, emulation: Any,
                     loop: TrainingLoop, scaler: Any, device: torch.device, params: list[nn.Parameter]) -> None:
        model, col = self.model, self.col
        traced = traced_ops if self.compile_backend is not None else nullcontext
        col.phase = ACT
        col.timeline.enter(FORWARD)
        self.values.active = True  # the batch's (and an assumed MoE routing's) values, forward and backward
        try:
            with (torch.autograd.graph.saved_tensors_hooks(col.pack, col.life.unpack_hook(col)), emulation,
                  hf_fake_as_real(model, self.values), one_hot_as_on_device(), loop.autocast_context(device.type),
                  traced()):
                output, loss = forward_and_loss(model, fake_in, fake_loss, loss_fn)
                unmatched: list[torch.Tensor] = []  # zero gradients held to the backward's end
                if self.probe is not None and self.probe.zero_gradients:  # what the compiled backward is handed
                    loss = with_zero_gradients(loss, output, self.probe.zero_gradients, unmatched)
            del output  # as a training loop does: `loss = model(**batch).loss; loss.backward()`
            col.phase = TEMP
            col.timeline.enter(BACKWARD)
            with traced():
                (loss if scaler is None else scaler.scale(loss)).backward()
            del loss, unmatched
        except Exception as exc:
            clear = unanswered_read_error(exc, self.values)
            if clear is None:
                raise
            raise clear from None
        finally:
            self.values.active = False
        if col.sharded is not None:
            col.sharded.book_grads(params)
        for m in hooks.mods.values():
            if m.bw_state == "open":
                hooks.close(m)

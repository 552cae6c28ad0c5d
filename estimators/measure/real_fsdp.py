"""Real FSDP2 training steps, measured per rank on this machine (gloo, CPU).

The ground truth for per-rank predictions of a sharded job
(``bench/bench_fsdp.py``, ``tests/estimators/measure/test_fsdp_real.py``). A step is
the one :func:`estimators.measure.real_step.measure_steps` runs (forward and loss,
``loss.backward()``, ``optimizer.step()``, ``zero_grad(set_to_none=True)``)
on a model sharded with ``fully_shard``; memory is counted the same way
(every distinct live storage once, at its bytes) with two things FSDP2 needs:

* a DTensor counts as its local shard (its wrapper's own storage is a
  placeholder of the global size, without data);
* FSDP2 frees and re-allocates the unsharded parameters (the all-gather
  outputs) with ``UntypedStorage.resize_``, outside the dispatcher: while a
  step is measured, every ``resize_`` books the storage at its new size
  (growing it is an allocation, a possible peak), so a storage counts at its
  current size, never at the size it had when first seen
  (``estimators.common.storage_book.follow_storage_resizes``, as the collector).

What is live at the peak is split by where FSDP2 made it (``unsharded``,
``all_gather``, ``reduce_scatter``: its record_function regions) besides
the usual kinds. gloo's own copy inside a CPU reduce-scatter (``backend``)
is left out of ``peak_bytes`` (a GPU's NCCL buffers are not in the
allocator either) and kept in ``peak_with_backend_bytes``; a model sharded
by :func:`shard` has none (on gloo its reduce-scatter is an in-place
all-reduce, ``estimators.measure.gloo_comms``, which also makes gloo let go of every
collective's buffers before FSDP2 goes on, so the peaks follow FSDP2's
program order exactly).

:func:`run_ranks` starts the ranks (``torch.multiprocessing.spawn``, gloo on
127.0.0.1, one thread each) and gathers what each returns.
"""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from estimators.common import (ACT, BUFFER, GRAD, INPUT, OPT, PARAM, TEMP, FsdpSetup, HostBook, StorageBook,
                               call_model, default_loss, default_units, follow_storage_resizes, is_host_side,
                               is_view_op, makes_host_copy, module_fqns, TrainingLoop, shard_model, storages_of,
                               unit_fqns)
from estimators.measure.gloo_comms import settle_gloo_collectives
from estimators.measure.real_step import BACKWARD, FORWARD, OPTIMIZER, StepMeasure

__all__ = ["ALL_GATHER", "BACKEND", "FsdpStepMeasure", "REDUCE_SCATTER", "UNSHARDED", "measure_fsdp_steps",
           "run_ranks", "shard"]

UNSHARDED = "unsharded"  # storages resized by UntypedStorage.resize_: FSDP2's all-gathered parameters
ALL_GATHER = "all_gather"  # made inside FSDP2's all-gather (the flat send/receive buffer)
REDUCE_SCATTER = "reduce_scatter"  # made inside FSDP2's gradient reduction, until they become sharded gradients
# A storage first seen as the output of a view op in the gradient reduction was allocated where the
# dispatcher does not show it: gloo's CPU reduce-scatter copies its input inside the collective and then
# splits the copy. NCCL's buffers are not in the allocator a GPU budget is about, so the peak compared with
# predictions leaves these out (``peak_with_backend_bytes`` has them).
BACKEND = "backend"
# FSDP2 names its steps with record_function, which the dispatcher shows as ops: storages made inside are its own.
_REGIONS = (("FSDP::all_gather_copy_out", UNSHARDED), ("FSDP::all_gather", ALL_GATHER),
            ("FSDP::post_backward_reduce", REDUCE_SCATTER))
_PHASE_CATEGORY = {FORWARD: ACT, BACKWARD: TEMP, OPTIMIZER: OPT}


@dataclass(frozen=True)
class FsdpStepMeasure(StepMeasure):
    """One rank's step: :class:`StepMeasure` without the backend's own buffers; ``peak_with_backend_bytes``
    the peak with them (gloo's reduce-scatter copies its input on the CPU: NCCL's buffers are not in the
    allocator a GPU budget is about)."""

    peak_with_backend_bytes: int | None = None


class _LiveLocalStorages(TorchDispatchMode):
    """Books every storage an op returns (DTensors by their shard) and follows the peak.

    Storages made inside FSDP2's all-gather or gradient reduction are booked as
    such; when a reduction ends, the sharded gradients (``on_reduced``) become
    gradients. Storages made under :func:`estimators.common.host_side` (offloaded activations' host copies) go to
    ``host_book``, as in :class:`estimators.measure.LiveStorages`.
    """

    def __init__(self, book: StorageBook, on_reduced: Callable[[], None]):
        super().__init__()
        self.book = book
        self.on_reduced = on_reduced
        self.regions: list[str] = []
        self.phase = FORWARD
        self.peak_bytes, self.peak_phase, self.peak_live = 0, FORWARD, {}
        self.peak_with_backend_bytes = 0
        self.host_book = HostBook()
        self.host_at_peak: int | None = None
        book.on_alloc.append(self._on_alloc)

    def live_bytes(self) -> int:
        """Live bytes but the backend's."""
        return sum(self.book.live.values()) - self.book.live[BACKEND]

    def restart_peak(self) -> None:
        self.peak_bytes, self.peak_phase, self.peak_live = self.live_bytes(), self.phase, dict(self.book.live)
        self.peak_with_backend_bytes = sum(self.book.live.values())
        self.host_book.restart()
        self.host_at_peak = self.host_book.peak_bytes

    def host_figures(self) -> tuple[int | None, int | None]:
        """(host peak, host bytes at the device peak); (None, None) if no host storage was made."""
        if self.host_book.peak_bytes is None:
            return None, None
        return self.host_book.peak_bytes, self.host_at_peak or 0

    def _on_alloc(self, category: str, live: dict[str, int]) -> None:
        everything = sum(live.values())
        self.peak_with_backend_bytes = max(self.peak_with_backend_bytes, everything)
        if everything - live[BACKEND] > self.peak_bytes:
            self.peak_bytes, self.peak_phase, self.peak_live = everything - live[BACKEND], self.phase, dict(live)
            self.host_at_peak = self.host_book.live_bytes()

    def _category(self) -> str:
        for name in reversed(self.regions):
            for prefix, category in _REGIONS:
                if name.startswith(prefix):
                    return category
        return _PHASE_CATEGORY[self.phase]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if is_host_side() or makes_host_copy(func):
            self.host_book.add(out)
            return out
        if func is torch.ops.profiler._record_function_enter_new.default:
            self.regions.append(str(args[0]))
        elif func.overloadpacket is torch.ops.profiler._record_function_exit and self.regions:
            if self.regions.pop().startswith("FSDP::post_backward_reduce"):
                self.on_reduced()
        category = self._category()
        if category == REDUCE_SCATTER and is_view_op(func):
            category = BACKEND
        for st in storages_of(out):
            self.book.add(st, category)
        return out


def _book_existing(book: StorageBook, model: nn.Module, inputs: Any, optimizer: torch.optim.Optimizer) -> None:
    for tensors, category in ((list(model.parameters()), PARAM), (list(model.buffers()), BUFFER),
                              ([p.grad for p in model.parameters() if p.grad is not None], GRAD),
                              ([list(s.values()) for s in optimizer.state.values()], OPT), (inputs, INPUT)):
        for st in storages_of(tensors):
            book.add(st, category)


def measure_fsdp_steps(model: nn.Module, inputs: Any, loss_fn: Callable[[Any], torch.Tensor] | None,
                       optimizer: torch.optim.Optimizer, *, steps: int = 3, seed: int | None = 0,
                       loop: TrainingLoop | None = None, sync_every_micro_batch: bool = True
                       ) -> list[FsdpStepMeasure]:
    """Run ``steps`` real training steps of a ``fully_shard``-ed ``model`` on this rank and measure each.

    As :func:`estimators.measure.real_step.measure_steps` (same step, same seeding,
    same peak: every distinct live storage once), with DTensors counted by
    their local shard and ``resize_``-d storages at their current size
    (``peak_live_bytes`` has them under ``"unsharded"``). Call it on every
    rank: the collectives need all of them. ``loop`` (:class:`estimators.common.TrainingLoop`; no
    ``GradScaler``) runs its micro-batches, autocast and clipping; with ``sync_every_micro_batch`` False,
    FSDP2 reduces gradients after the last micro-batch only (``set_requires_gradient_sync(False)`` before
    the others: each unit keeps its unsharded gradients until then).
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps!r}")
    loop = loop or TrainingLoop()
    if loop.grad_scaler:
        raise ValueError("loop.grad_scaler: a GradScaler over FSDP2's sharded gradients is not measured here")
    loss_fn = loss_fn or default_loss
    book = StorageBook()
    book.live.update({UNSHARDED: 0, ALL_GATHER: 0, REDUCE_SCATTER: 0, BACKEND: 0})
    params = list(model.parameters())

    def book_grads() -> None:
        book.recategorize_all(storages_of([p.grad for p in params if p.grad is not None]), GRAD)

    tracker = _LiveLocalStorages(book, book_grads)
    out = []
    for k in range(steps):
        if seed is not None:
            torch.manual_seed(seed + k)
        _book_existing(book, model, inputs, optimizer)
        tracker.phase = FORWARD
        tracker.restart_peak()
        start = tracker.live_bytes()
        seconds = dict.fromkeys((FORWARD, BACKWARD, OPTIMIZER), 0.0)
        with follow_storage_resizes(book, lambda: UNSHARDED), tracker:
            for micro in range(1, loop.grad_accumulation + 1):
                if not sync_every_micro_batch:
                    model.set_requires_gradient_sync(micro == loop.grad_accumulation)
                tracker.phase, t = FORWARD, time.process_time()
                with loop.autocast_context(params[0].device.type if params else "cpu"):
                    output = call_model(model, inputs)
                    loss = loss_fn(output)
                del output
                seconds[FORWARD] += time.process_time() - t
                tracker.phase, t = BACKWARD, time.process_time()
                loss.backward()
                value = loss.item()
                del loss
                seconds[BACKWARD] += time.process_time() - t
            tracker.phase, t = OPTIMIZER, time.process_time()
            loop.optimizer_step(optimizer, params)
            optimizer.zero_grad(set_to_none=True)
            seconds[OPTIMIZER] = time.process_time() - t
        host_peak, host_live = tracker.host_figures()
        out.append(FsdpStepMeasure(k + 1, value, sum(seconds.values()), seconds, tracker.peak_bytes,
                                   tracker.peak_phase, tracker.peak_live, start, host_peak_bytes=host_peak,
                                   host_live_bytes=host_live, peak_with_backend_bytes=tracker.peak_with_backend_bytes))
    return out


def shard(model: nn.Module, mesh: Any, *, world_size: int, mixed_precision: str | None = None,
          reshard_after_forward: bool = True) -> list[str]:
    """``fully_shard`` the model as ``sacplan collect --fsdp-world-size`` does (its units: the model's
    ``_no_split_modules`` classes, then the root); returns the units' FQNs as the stats name them."""
    setup = FsdpSetup(world_size, mixed_precision=mixed_precision, reshard_after_forward=reshard_after_forward)
    fqns = module_fqns(model)
    units = unit_fqns(model, default_units(model), fqns)
    shard_model(model, setup, mesh, units, fqns)
    if mesh.ndim == 1 and dist.get_backend(mesh.get_group()) == "gloo":
        settle_gloo_collectives(model)  # buffers released in FSDP2's program order, as the stats count them
    return units


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, fn: Callable[..., Any], world_size: int, port: int, args: tuple, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        result = fn(rank, world_size, *args)
        Path(out_dir, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` processes joined by gloo; their results, by rank.

    ``fn`` must be importable by name (a module-level function). Each rank
    runs on one thread (``OMP_NUM_THREADS=1``), talks over 127.0.0.1 only,
    and leaves its process group destroyed; a rank's failure raises here.
    """
    import torch.multiprocessing as mp

    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    env = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with tempfile.TemporaryDirectory(prefix="sacplan-ranks-") as out_dir:
            mp.spawn(_rank_main, args=(fn, world_size, _free_port(), args, out_dir), nprocs=world_size)
            return [pickle.loads(Path(out_dir, f"rank{r}.pkl").read_bytes()) for r in range(world_size)]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

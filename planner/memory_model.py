"""The memory model: the step's memory at the moments its peak can occur, for given per-module discards.

Every moment t has a base (its memory with no checkpointing) and a key: the
discard ``d_c`` of a checkpointed module c is in effect at t when c sits at a
``fw_post_order`` position below the key (its forward has finished and its
backward, where its recompute brings the activations back, has not started).
So, for any plan,

    m_t = base_t - sum(d_c * ([post(c) < key_t] + r_ct) for checkpointed c)

(``r_ct``: calls of c after its first whose discard is in effect at t, from
the moment's ``repeat_calls_discarding``; the key covers the first call) and
the step's peak is the largest ``m_t``. Two sets of moments:

* ``step`` (stats with a ``timeline``, which sacplan's collector writes): the
  collected step's own moments, forward, backward and the optimizer step, at
  their most live memory. ``base_t`` = activation_bytes + (parameters +
  gradients + optimizer memory) / world_size: in the steady state (every step
  after the first) the optimizer state is live throughout, in the first step
  only from the optimizer step on.
* ``torch`` (PyTorch's format, and stats without a timeline): PyTorch's
  ``sac_milp`` model, one moment per module n at key post(n),
  ``TA_n + AG_n + (P + TG_n [+ optimizer state]) / world_size``.

``reserve_bytes`` is added to every moment. See docs/memory-model.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from operator import attrgetter
from typing import Literal

import numpy as np

from planner.ops.frontier import max_discard_decision
from planner.ops.forward_moments import forward_excess_bytes, forward_moments_known
from planner.ops.recompute import recompute_transient_bytes
from planner.pipeline_interleaved import interleaved_stage_model
from planner.pipeline_schedule import schedule_stage_model
from planner.stats.format import ModuleStats, Stats
from planner.stats.sharding import sharded_world_size

__all__ = ["GIB", "MIB", "NEED_TOL_BYTES", "MemoryModel", "memory_model", "baseline_peak_bytes", "compute_ms",
           "discardable_bytes"]

GIB = 2**30
MIB = 2**20
# Bytes are whole, but needs are floats (budget * 2**30, sharded terms / world_size):
# a plan meets a need when its discard falls short by at most float noise, never
# by a real fraction of a byte, so a plan's peak never exceeds its budget.
NEED_TOL_BYTES = 1e-6

_PHASE_ORDER = {"forward": 0, "backward": 1, "optimizer": 2}


@dataclass(frozen=True)
class MemoryModel:
    """The step's key moments: per moment its key, its memory with no discards, and what runs then."""

    kind: Literal["step", "torch"]
    note: str  # which model, and why
    keys: np.ndarray  # per moment: discards of modules at post-order positions below this apply
    base_bytes: np.ndarray  # per moment: memory with no discards (float: sharding divides)
    phases: tuple[str, ...]  # per moment: forward, backward or optimizer
    modules: tuple[str | None, ...]  # per moment: the module running, if any
    post_pos: Mapping[str, int]  # module fqn -> its position in forward post-order
    # step model: fqn -> inputs a checkpointed module holds until its backward ends (held_input_bytes), and
    # the first post-order position of its subtree: backward moments keyed inside it are in its backward
    held_bytes: Mapping[str, float] = field(default_factory=dict)
    first_pos: Mapping[str, int] = field(default_factory=dict)
    # step model, modules called more than once: fqn -> per moment, how many of its calls after the first
    # discard then (``repeat_calls_discarding``) and how many are in their own backward (``repeat_calls_in_backward``)
    repeats: Mapping[str, np.ndarray] = field(default_factory=dict)
    repeats_held: Mapping[str, np.ndarray] = field(default_factory=dict)
    # fqn -> (tensor number, bytes) of the inputs in held_bytes, when the stats say which tensors they are
    held_inputs: Mapping[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    # fqn -> {op index: tensor numbers of its outputs some module holds}; fqn -> (op index, bytes) of a chained
    # module's op whose output the next call holds (the stats' held_tensors and chained_calls)
    op_held: Mapping[str, Mapping[int, tuple[int, ...]]] = field(default_factory=dict)
    chained: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    # gradient accumulation: per moment its micro-batch (None: the only one, or the optimizer step), and how many
    micro_batches: tuple[int | None, ...] = ()
    grad_accumulation: int = 1
    # step model: fqn -> (the key of the backward moment its recompute runs in, its stats) for modules whose
    # stats say what a recompute holds (planner.ops.recompute), and what the engines add there for it: the
    # transient of its largest discard (a safe bound only where no other save list holds more)
    recompute_at: Mapping[str, tuple[int, ModuleStats]] = field(default_factory=dict)
    engine_transient: Mapping[str, float] = field(default_factory=dict)
    # per moment, base_bytes by what the memory is: parameters, gradients, optimizer state, activations (everything
    # else live: activation gradients, temporaries, inputs, buffers) and reserve; they add up to base_bytes
    base_by_kind: Mapping[str, np.ndarray] = field(default_factory=dict)
    # step model: fqn -> its stats, for the modules whose ops say where in the forward they run and what they hold
    # (planner.ops.forward_moments), and per forward key the plain step's most live bytes but parameters,
    # gradients and optimizer memory there (the first micro-batch's)
    forward_ops: Mapping[str, ModuleStats] = field(default_factory=dict)
    forward_most: Mapping[int, float] = field(default_factory=dict)

    @cached_property
    def _backward(self) -> np.ndarray:
        """Per moment, whether it is in the backward."""
        return np.array([p == "backward" for p in self.phases], dtype=bool)

    def profile_bytes(self, discarded: Mapping[str, float] | None = None, *, held: bool = True,
                      shared_once: bool = True, saves: Mapping[str, Sequence[int]] | None = None,
                      offloaded: Mapping[int | str, float] | None = None) -> np.ndarray:
        """m_t per moment (in step order) with ``discarded[fqn]`` bytes freed by each checkpointed module.

        ``offloaded``: credit key -> bytes offloaded to host memory, off the device at the moments whose key is
        at least the credit key (an offload window's, :meth:`planner.solve.offload.OffloadWindows.credits`);
        fqn -> bytes each call of a module offloading per call drops, off wherever its discard counts.

        A checkpointed module's discard counts from the end of its forward
        until its backward starts; its held inputs (step model) count on
        through its own backward, which the discard no longer offsets
        (``held=False``: not). A held tensor several checkpointed modules take counts
        once (``shared_once=False``: once per module, as the engines' needs have it); so does a
        tensor a module holds that a checkpointed module's saved op made, given the plan's
        per-op decisions ``saves`` (fqn -> save list).
        """
        m = self.base_bytes.copy()
        backward = None
        for fqn, d in (discarded or {}).items():
            post = self.post_pos[fqn]
            self._off_between_calls(m, fqn, d)
            if held and fqn in self.repeats_held:
                m += self.repeats_held[fqn] * self.held_bytes.get(fqn, 0.0)
            if held and self.held_bytes.get(fqn):
                if backward is None:
                    backward = self._backward
                m[backward & (self.keys <= post) & (self.keys >= self.first_pos[fqn])] += self.held_bytes[fqn]
            if held and fqn in self.recompute_at:
                m += self.transient_bytes(fqn, None if saves is None else saves.get(fqn))
            if saves is not None and fqn in self.forward_ops and fqn in saves:
                m += self.forward_excess(fqn, saves[fqn])
        if held and shared_once and discarded and self.held_inputs:
            m -= self._held_more_than_once(discarded, saves or {})
        if held and shared_once and discarded and saves:
            for fqn, (op, nbytes) in self.chained.items():  # call k's saved op is call k+1's held input
                if fqn in discarded and fqn in saves and saves[fqn][op]:
                    m -= nbytes * (self.repeats.get(fqn, 0.0) + self.repeats_held.get(fqn, 0.0))
        for key, nbytes in (offloaded or {}).items():
            if isinstance(key, str):  # a module offloading per call: off wherever each call's discard is
                self._off_between_calls(m, key, nbytes)
                continue
            m[self.keys >= key] -= nbytes
        return m

    def _off_between_calls(self, m: np.ndarray, fqn: str, nbytes: float) -> None:
        """Take ``nbytes`` off ``m`` wherever a call of ``fqn`` has ended its forward and not begun its backward
        (the first call by key; every call of a module called more than once discards, each in its own span)."""
        m[self.keys > self.post_pos[fqn]] -= nbytes
        if fqn in self.repeats:
            m -= self.repeats[fqn] * nbytes

    @cached_property
    def _forward(self) -> np.ndarray:
        """Per moment, whether it is in the forward."""
        return np.array([p == "forward" for p in self.phases], dtype=bool)

    def forward_excess(self, fqn: str, save: Sequence[int]) -> np.ndarray:
        """Per moment, what checkpointed ``fqn`` with ``save`` holds in its own forward beyond the step without
        checkpointing (:func:`planner.ops.forward_moments.forward_excess_bytes`; every micro-batch's forward alike;
        0 where the stats do not say)."""
        out = np.zeros(len(self.keys))
        module = self.forward_ops.get(fqn)
        if module is None:
            return out
        for key, nbytes in forward_excess_bytes(module, save, self.forward_most).items():
            out[self._forward & (self.keys == key)] += nbytes
        return out

    def transient_bytes(self, fqn: str, save: Sequence[int] | None) -> np.ndarray:
        """Per moment, what a recompute of checkpointed ``fqn`` with ``save`` adds (the engines' figure without)."""
        out = np.zeros(len(self.keys))
        if fqn not in self.recompute_at:
            return out
        key, module = self.recompute_at[fqn]
        extra = self.engine_transient.get(fqn, 0.0) if save is None else recompute_transient_bytes(module, save)
        if extra:
            out[self._backward & (self.keys == key)] = extra
        return out

    def _held_more_than_once(self, discarded: Mapping[str, float], saves: Mapping[str, Sequence[int]]
                             ) -> np.ndarray:
        """Per moment, the bytes of inputs the held term counts for several checkpointed modules at once.

        One tensor several modules take (an attention mask every layer gets)
        is one allocation: held from the first of them finishing its forward
        until that one's backward ends, once, however many hold it. A
        checkpointed module that saves the op making it (the module before
        the holder, saving its last op) counts it too, from the end of its
        forward until its backward starts: one allocation all the same.
        """
        sizes = {number: nbytes for fqn in discarded for number, nbytes in self.held_inputs.get(fqn, ())}
        nbytes_of: dict[int, int] = {}
        posts: dict[int, list[int]] = {}  # number -> the post of each window (each counts after it)
        spans: dict[int, list[tuple[int, int]]] = {}  # number -> (first, post) of each window held in backward
        for fqn in discarded:
            post = self.post_pos[fqn]
            for number, nbytes in self.held_inputs.get(fqn, ()):
                nbytes_of[number] = nbytes
                posts.setdefault(number, []).append(post)
                spans.setdefault(number, []).append((self.first_pos[fqn], post))
            save = saves.get(fqn)
            if save is not None:
                for op, numbers in self.op_held.get(fqn, {}).items():
                    for number in numbers if save[op] else ():
                        if number in sizes:
                            nbytes_of[number] = sizes[number]
                            posts.setdefault(number, []).append(post)
        # a tensor in one window is never counted twice: only the others are counted, per moment
        shared = [number for number in nbytes_of if len(posts[number]) > 1]
        return _excess_bytes(self.keys, self._backward, [nbytes_of[n] for n in shared], [posts[n] for n in shared],
                             [spans.get(n, []) for n in shared])

    def peak_bytes(self, discarded: Mapping[str, float] | None = None, *, held: bool = True,
                   shared_once: bool = True, saves: Mapping[str, Sequence[int]] | None = None,
                   offloaded: Mapping[int | str, float] | None = None) -> float:
        """The step's peak with ``discarded[fqn]`` bytes freed by each checkpointed module (and ``offloaded``
        as for :meth:`profile_bytes`)."""
        return float(self.profile_bytes(discarded, held=held, shared_once=shared_once, saves=saves,
                                        offloaded=offloaded).max())

    def describe(self, t: int) -> str:
        """Moment t in words: 'backward of Model.layers.3', 'optimizer step', 'forward'."""
        phase, module = self.phases[t], self.modules[t]
        if phase == "optimizer":
            return "optimizer step"
        if phase == "module":  # PyTorch's model: a module's end of forward and backward peak, as one
            return f"module {module}"
        where = f"{phase} of {module}" if module else phase
        micro = self.micro_batches[t] if self.micro_batches else None
        return f"{where} (micro-batch {micro} of {self.grad_accumulation})" if micro is not None else where


def _excess_bytes(keys: np.ndarray, backward: np.ndarray, nbytes: list[int], posts: list[list[int]],
                  spans: list[list[tuple[int, int]]]) -> np.ndarray:
    """Per moment, the sum over tensors of ``nbytes`` x (windows holding it then - 1, at least 0).

    A tensor's window from a post counts at the moments whose key is above it; one from a span (first, post) at
    backward moments whose key is inside it (a holder's window is both: its own backward and after its forward).
    Counted in key space (cumulative sums over keys), then read at each moment's key: exact integers, a few
    tensors at a time so the counts stay small.
    """
    excess = np.zeros(len(keys), dtype=np.int64)
    if not nbytes:
        return excess.astype(np.float64)
    lo = min(int(keys.min()), min(min(p) for p in posts), min((f for s in spans for f, _ in s), default=0), 0)
    width = max(int(keys.max()), max(max(p) for p in posts)) - lo + 2
    at = keys - lo
    step = max(1, 4_000_000 // max(len(keys), width))
    for start in range(0, len(nbytes), step):
        rows = range(start, min(start + step, len(nbytes)))
        after = np.zeros((len(rows), width), dtype=np.int64)
        held = np.zeros((len(rows), width), dtype=np.int64)
        for r, i in enumerate(rows):
            np.add.at(after[r], np.asarray(posts[i], dtype=np.int64) - lo + 1, 1)
            for first, post in spans[i]:
                if first <= post:
                    held[r, first - lo] += 1
                    held[r, post - lo + 1] -= 1
        counts = np.cumsum(after, axis=1)[:, at] + np.where(backward, np.cumsum(held, axis=1)[:, at], 0)
        size = np.asarray([nbytes[i] for i in rows], dtype=np.int64)
        excess += (size[:, None] * np.maximum(counts - 1, 0)).sum(axis=0)
    return excess.astype(np.float64)


def memory_model(stats: Stats, *, world_size: int = 1, first_step_only: bool = False,
                 reserve_bytes: float = 0.0) -> MemoryModel:
    """The memory model of ``stats`` for ``world_size`` ranks (steady state unless ``first_step_only``).

    Stats collected sharded (``metadata.sharding``) are one rank's already: used
    as they are, with ``world_size`` 1 or the collected world size, refused otherwise.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    world_size = sharded_world_size(stats.metadata.sharding, world_size)  # per-rank stats: divide by nothing
    post = {f: k for k, f in enumerate(stats.fw_post_order)}
    model = _step(stats, post, world_size, first_step_only) if stats.timeline else \
        _torch(stats, post, world_size, first_step_only)
    if stats.metadata.pipeline is not None and model.kind == "step":  # the stage's step along its schedule
        info = stats.metadata.pipeline
        model = interleaved_stage_model(model, info) if info.chunks else \
            schedule_stage_model(model, info, stats.root.output_bytes)
    if reserve_bytes:
        model = replace(model, base_bytes=model.base_bytes + reserve_bytes,
                        base_by_kind={**model.base_by_kind, "reserve": np.full(len(model.keys), float(reserve_bytes))})
    return model


def _step(stats: Stats, post: dict[str, int], world_size: int, first_step_only: bool) -> MemoryModel:
    root = stats.root
    state = 0 if first_step_only else root.optimizer_state_bytes
    # in step order: micro-batch by micro-batch (forward, then backward), then the optimizer step
    moments = sorted(stats.timeline, key=lambda t: (t.phase == "optimizer", t.micro_batch or 0, _PHASE_ORDER[t.phase],
                                                    t.key if t.phase == "forward" else -t.key))
    kinds = {"parameters": np.full(len(moments), root.param_bytes / world_size),
             "gradients": np.array([t.grad_bytes / world_size for t in moments], dtype=np.float64),
             "optimizer state": np.array([(t.optimizer_bytes if t.phase == "optimizer" else state) / world_size
                                          for t in moments], dtype=np.float64),
             "activations": np.array([t.activation_bytes for t in moments], dtype=np.float64)}
    base = np.array([t.activation_bytes + (root.param_bytes + t.grad_bytes
                                           + (t.optimizer_bytes if t.phase == "optimizer" else state)) / world_size
                     for t in moments], dtype=np.float64)
    when = "the first step (no optimizer state before the optimizer step)" if first_step_only else \
        "the steady state (optimizer state live throughout)"
    if stats.metadata.grad_accumulation:
        when += f", {stats.metadata.grad_accumulation} micro-batches per optimizer step"
    first = dict(post)
    for fqn in stats.fw_post_order:  # a subtree's first position: in post-order a module's children come before it
        parent = stats.module(fqn).parent
        if parent is not None and first[fqn] < first[parent]:
            first[parent] = first[fqn]
    held = {m.fqn: float(m.held_input_bytes) for m in stats.modules if m.held_input_bytes}
    held_inputs = {m.fqn: tuple(m.held_inputs) for m in stats.modules if m.held_inputs}
    op_held = {m.fqn: {k: tuple(op.held_tensors) for k, op in enumerate(m.ops) if op.held_tensors}
               for m in stats.modules if m.ops and any(map(_HELD_TENSORS, m.ops))}
    chained = {m.fqn: (m.chained_calls[0], float(m.chained_calls[1])) for m in stats.modules if m.chained_calls}
    recompute_at = {m.fqn: (m.recompute_key, m) for m in stats.modules
                    if m.recompute_key is not None and m.ops and any(op.storages for op in m.ops)}
    engine_transient = {f: float(recompute_transient_bytes(m, max_discard_decision(m.ops, m.force_store_random)[0]))
                        for f, (_, m) in recompute_at.items()}
    forward_ops = {m.fqn: m for m in stats.modules if not m.is_leaf and forward_moments_known(m)}
    forward_most: dict[int, float] = {}
    for t in moments:  # the first micro-batch's: the ops' figures are its
        if t.phase == "forward" and t.micro_batch in (None, 1):
            forward_most[t.key] = min(forward_most.get(t.key, np.inf), float(t.activation_bytes))
    return MemoryModel("step", f"the collected step's timeline, {when}", np.array([t.key for t in moments]), base,
                       tuple(t.phase for t in moments), tuple(t.module for t in moments), post, held, first,
                       _per_moment(moments, "repeat_calls_discarding"), _per_moment(moments, "repeat_calls_in_backward"),
                       held_inputs, op_held, chained, tuple(t.micro_batch for t in moments),
                       stats.metadata.grad_accumulation or 1, recompute_at, engine_transient, kinds,
                       forward_ops if forward_most else {}, forward_most)


_HELD_TENSORS = attrgetter("held_tensors")


def _per_moment(moments: list, name: str) -> dict[str, np.ndarray]:
    """fqn -> the count ``moment.<name>`` gives it, per moment (0 where absent), for every module named."""
    out: dict[str, np.ndarray] = {}
    for t, moment in enumerate(moments):
        for fqn, count in getattr(moment, name).items():
            out.setdefault(fqn, np.zeros(len(moments)))[t] = count
    return out


def _torch(stats: Stats, post: dict[str, int], world_size: int, first_step_only: bool) -> MemoryModel:
    state = 0 if first_step_only else stats.root.optimizer_state_bytes
    sharded = stats.root.param_bytes + state
    fqns = sorted(stats.fw_post_order, key=post.__getitem__)
    kinds = {"parameters": np.full(len(fqns), stats.root.param_bytes / world_size),
             "gradients": np.array([stats.module(f).grad_total_bytes / world_size for f in fqns], dtype=np.float64),
             "optimizer state": np.full(len(fqns), state / world_size),
             "activations": np.array([stats.module(f).act_total_bytes + stats.module(f).act_grad_bytes for f in fqns],
                                     dtype=np.float64)}
    base = np.array([stats.module(f).act_total_bytes + stats.module(f).act_grad_bytes
                     + (sharded + stats.module(f).grad_total_bytes) / world_size for f in fqns], dtype=np.float64)
    torch_source = stats.metadata.tags.get("source_format") == "torch"
    why = "PyTorch-format stats" if torch_source else "the stats have no timeline (collected before planner 0.5)"
    note = f"PyTorch's sac_milp model, one moment per module ({why}; recollect with sacplan collect to follow the step)"
    if torch_source:
        note = "PyTorch's sac_milp model, one moment per module (PyTorch-format stats: like for like with sac_milp)"
    return MemoryModel("torch", note, np.array([post[f] for f in fqns]), base, ("module",) * len(fqns),
                       tuple(fqns), post, base_by_kind=kinds)


def baseline_peak_bytes(stats: Stats, *, world_size: int = 1, first_step_only: bool = False,
                        reserve_bytes: float = 0.0) -> int:
    """Peak memory with no checkpointing, rounded up to whole bytes."""
    model = memory_model(stats, world_size=world_size, first_step_only=first_step_only, reserve_bytes=reserve_bytes)
    return int(np.ceil(model.peak_bytes()))


def discardable_bytes(m: ModuleStats) -> int:
    """The most checkpointing ``m`` can free: its autograd-saved activations (IA) less the inputs it holds."""
    return m.act_saved_bytes - m.held_input_bytes


def compute_ms(stats: Stats) -> float:
    """Forward + backward time of the step, without recomputation: its ops' runtimes alone, no host overhead."""
    return stats.root.fw_ms + stats.root.bw_ms

"""The selective-checkpoint policy of one planned module: which decision each op it runs gets.

One :class:`ModulePlan` per planned module holds the plan's decisions for the
stats' op list and, after :func:`estimators.check_plan` recorded a traced
run, the verified decisions for that sequence. Each checkpointed call gets a
fresh :class:`CallPolicy` (``torch.compile`` traces a region more than once).

How a call is run, by where the policy is called from:

* ``eager``: the plain eager forward. Matched online against the stats
  (:mod:`estimators.apply.alignment`, strict): views and constants are
  recomputed, every other op must be the stats' next one.
* ``compiled``: the graph ``torch.compile`` made, run eagerly (the ``eager``
  backend), or traced by AOTAutograd (``aot_eager``, ``inductor``: the
  policy only tags graph nodes). Decisions come from the sequences
  :func:`check_plan` recorded and aligned; without one, the eager rule.

Random ops must draw the same numbers when recomputed. In eager runs
``preserve_rng_state=True`` replays them. ``torch.compile``'s checkpoint
wrapper turns ``preserve_rng_state`` off (it leaves RNG replay to Inductor's
CUDA passes), so under the ``eager`` backend :func:`rng_replay_contexts`
saves the RNG state at the forward and restores it for the recomputation,
and the plan's decision holds. Saving an in-place random op instead is no
fix there: CPU dropout's ``bernoulli_`` fills a tensor that ATen keeps
using, whatever a cache returns for the op. Under AOTAutograd tracing
(``aot_eager``, ``inductor``) random ops are tagged ``MUST_SAVE``: the
partitioner replays RNG in a recomputation only with
``functionalize_rng_ops`` (a CUDA feature) and otherwise bans recomputing
random ops itself (measured: the same gradients without the tag, in
torch 2.13); the tag makes that explicit rather than left to its heuristics.
In-place ops (eager and the ``eager`` backend): one that mutates a tensor
whose current value was saved is saved too, else a recomputation would
apply it a second time to the cached tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy

from estimators.apply.alignment import Alignment, StatsOps, substantive
from estimators.common import is_inplace_op, is_random_op, is_view_op, op_name, storages_of
from planner import MUST_SAVE_OPS

__all__ = ["PlanMismatchError", "ModulePlan", "CallPolicy", "RngReplay", "aot_tracing", "planned_modules",
           "PLAN_MARK", "EAGER", "COMPILED", "TRACED", "OFFLOADED"]

EAGER, COMPILED, TRACED = "eager", "compiled", "traced"  # plain eager; compile's eager backend; AOT tracing
OFFLOADED = 2  # a decision in the traced tables: saved, and offloaded (1: saved, 0: recomputed)
PLAN_MARK = "_sacplan_plan"  # the attribute holding a wrapped module's ModulePlan
# A functional collective's wait as an eager run names it (its result wrapped, waited where first used) and as
# AOTAutograd's trace, and stats collected for a compiled step, name it (waited at once)
_EAGER_WAIT, _TRACED_WAIT = "_c10d_functional._wrap_tensor_autograd", "_c10d_functional.wait_tensor"


class PlanMismatchError(RuntimeError):
    """The model runs ops the plan's decisions cannot be mapped onto without guessing."""


@dataclass
class ModulePlan:
    """The plan of one module and everything learned about how it runs."""

    fqn: str
    stats: StatsOps | None  # None: a plan without op names (decisions by position)
    save: tuple[int, ...]
    hint: str = ""  # the likely cause of an eager mismatch, from the stats' metadata and the model
    tables: dict[str, list[Alignment]] = field(default_factory=dict)  # verified decisions per mode
    recording: dict[str, list[list[tuple[str, bool, bool]]]] | None = None
    last_call: CallPolicy | None = None
    # the autocast dtype the stats' forward ran under (None: off), when the stats say; checked at the first call
    autocast: tuple[str | None] | None = None
    traced_stats: bool = False  # the stats were collected under a compile backend: their ops are AOT's
    # stats of a compiled TP step: under AOT tracing every seeded op counts as random (saved; see
    # estimators.collect.tensor_parallel.is_seeded_op), as the stats count it
    seeded_random: bool = False
    # the plan's offload decisions, parallel to save (1: the saved output goes to host memory), or None
    offload: tuple[int, ...] | None = None
    host_store: Any = None  # the estimators.apply.offload.HostStore of the model, when the plan offloads
    offload_per_call: bool = False  # the plan's offload_calls: a module called more than once offloads per call

    def new_call(self, compiled: bool) -> CallPolicy:
        call = CallPolicy(self, compiled)
        self.last_call = call
        return call

    def mismatch(self, k: int, name: str, mode: str, expected: str | None) -> PlanMismatchError:
        have = f"the plan's stats have {expected}" if expected else f"the plan was made for {len(self.save)} ops"
        if mode == EAGER:
            cause = self.hint or ("the model is not the one the stats were collected from (its code, config, "
                                  "dtype or inputs changed); fix: collect the stats again from this model")
        else:
            cause = ("torch.compile traced a sequence check_plan did not record (or no check ran); fix: "
                     "call apply_plan(model, plan, stats=stats, example_inputs=batch, compile_backend=BACKEND) "
                     "or check_plan(model, batch, compile_backend=BACKEND) before compiling")
        where = {EAGER: "", COMPILED: " (under torch.compile, eager backend)", TRACED: " (under torch.compile)"}[mode]
        return PlanMismatchError(f"module {self.fqn!r}: op {k} is {name} but {have}{where}. Likely cause: {cause}")


def aot_tracing() -> bool:
    """Whether ops run on a tracer's fake tensors (AOTAutograd, export, dynamo's example values), not real ones."""
    keys = torch._C._TorchDispatchModeKey  # layout: allow-private (torch's own test, as torch.utils.checkpoint's)
    return any(torch._C._get_dispatch_mode(k) is not None  # layout: allow-private (as above)
               for k in (keys.PROXY, keys.FAKE))


class RngReplay:
    """A pair of contexts around checkpoint's own: the forward's RNG state, set again for the recomputation."""

    def __init__(self, forward_ctx: Any, recompute_ctx: Any):
        self.forward_ctx, self.recompute_ctx = forward_ctx, recompute_ctx
        self.state: tuple | None = None

    @staticmethod
    def _get() -> tuple:
        return torch.get_rng_state(), (torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None)

    @staticmethod
    def _set(state: tuple) -> None:
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state_all(state[1])

    def contexts(self) -> tuple[Any, Any]:
        from contextlib import contextmanager

        @contextmanager
        def forward() -> Any:
            self.state = self._get()
            with self.forward_ctx:
                yield

        @contextmanager
        def recompute() -> Any:
            outside = self._get()
            self._set(self.state)
            try:
                with self.recompute_ctx:
                    yield
            finally:
                self._set(outside)

        return forward(), recompute()


class CallPolicy:
    """The decisions of one checkpointed call, op by op (a selective-checkpoint policy function)."""

    def __init__(self, plan: ModulePlan, compiled: bool):
        self.plan, self.compiled = plan, compiled
        self.mode: str | None = None
        self.count = 0  # ops seen
        self.pos = 0  # eager rule: the next stats op
        self.planned_at: int | None = None  # the plan position the current op took its decision from
        self.random_decision: int | None = None
        self.saved_storages: set[int] = set()
        self.candidates: list[Alignment] | None = None
        self.record: list[tuple[str, bool, bool]] | None = None

    def _start(self) -> None:
        self.mode = TRACED if self.compiled and aot_tracing() else COMPILED if self.compiled else EAGER
        rec = self.plan.recording
        if rec is not None:
            self.record = []
            rec.setdefault(self.mode, []).append(self.record)
        elif self.mode in self.plan.tables:
            self.candidates = list(self.plan.tables[self.mode])

    def __call__(self, ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if self.mode is None:
            self._start()
        k, name = self.count, op_name(func)
        self.planned_at = None
        if name == _EAGER_WAIT and self.plan.traced_stats:
            name = _TRACED_WAIT  # an eager run of a plan made for the compiled step (its wait: the traced one)
        self.count += 1
        view, random = is_view_op(func), is_random_op(func, args, kwargs)
        if self.plan.seeded_random and self.mode == TRACED and torch.Tag.nondeterministic_seeded in func.tags:
            random = True
        if self.record is not None:
            self.record.append((name, view, random))
            decision = 0  # a recording run's decisions are thrown away with its compiled graph
        elif self.candidates is not None:
            decision = self._from_table(k, name)
        else:
            decision = self._eager_rule(k, name, view)
        if random:
            decision = self._random(k, name, decision)
        if name in MUST_SAVE_OPS:  # a collective: recomputing it would communicate again
            decision = 1
        if self.mode != TRACED:
            decision = self._inplace(func, args, decision, getattr(ctx, "op_output", None))
        if decision and self._offloaded(decision):
            return CheckpointPolicy.MUST_CPU_OFFLOAD
        return CheckpointPolicy.MUST_SAVE if decision else CheckpointPolicy.PREFER_RECOMPUTE

    def _offloaded(self, decision: int) -> bool:
        """Whether the plan offloads the op just decided: where the eager rule matched it to a plan op, or (compiled)
        where the aligned table says 2 (:data:`OFFLOADED`)."""
        if self.mode != EAGER:
            return decision == OFFLOADED
        offload, at = self.plan.offload, self.planned_at
        return offload is not None and at is not None and self.mode == EAGER and bool(offload[at])

    def _from_table(self, k: int, name: str) -> int:
        left = [a for a in self.candidates if k < len(a.names) and a.names[k] == name]
        if not left:
            expected = next((a.names[k] for a in self.candidates if k < len(a.names)), None)
            raise self.plan.mismatch(k, name, self.mode, expected)
        decisions = {a.save[k] for a in left}
        if len(decisions) > 1:
            raise PlanMismatchError(f"module {self.plan.fqn!r}: op {k} ({name}) has different decisions in the "
                                    f"sequences check_plan recorded for this mode; the plan cannot be applied here")
        self.candidates = left
        return decisions.pop()

    def _eager_rule(self, k: int, name: str, view: bool) -> int:
        stats, save = self.plan.stats, self.plan.save
        if stats is None:  # no names: position k takes decision k
            if k >= len(save):
                raise self.plan.mismatch(k, name, self.mode, None)
            self.planned_at = k
            return save[k]
        n = len(stats.names)
        if not substantive(name, view):
            if view and self.pos < n and stats.names[self.pos] == name:
                self.pos += 1  # the same view as the stats': stay in step
            return 0
        while self.pos < n and not substantive(stats.names[self.pos], stats.view[self.pos]):
            self.pos += 1
        if self.pos >= n:
            raise self.plan.mismatch(k, name, self.mode, None)
        if stats.names[self.pos] != name:
            raise self.plan.mismatch(k, name, self.mode, stats.names[self.pos])
        self.pos += 1
        self.planned_at = self.pos - 1
        return save[self.pos - 1]

    def missing_op(self) -> str | None:
        """After an eager call: what of the plan the call did not run, or None."""
        stats, n = self.plan.stats, len(self.plan.save)
        if stats is None:
            return None if self.count == n else f"the plan was made for {n}"
        rest = [i for i in range(self.pos, len(stats.names)) if substantive(stats.names[i], stats.view[i])]
        return f"the first planned op it did not run is op {rest[0]} ({stats.names[rest[0]]})" if rest else None

    def _random(self, k: int, name: str, decision: int) -> int:
        if self.mode == TRACED:  # no RNG replay in a traced recomputation on the CPU: keep what the forward drew
            return OFFLOADED if decision == OFFLOADED else 1  # (on the host, where the plan offloads it)
        if self.random_decision is None:
            self.random_decision = decision
        elif decision != self.random_decision:
            raise PlanMismatchError(
                f"module {self.plan.fqn!r}: random op {k} ({name}) has save={decision} but an earlier random op "
                f"has save={self.random_decision}: random ops must all be saved or all recomputed")
        return decision

    def _inplace(self, func: Any, args: tuple, decision: int, output: Any) -> int:
        # storages by what holds their data: a DTensor's shard, an AsyncCollectiveTensor's result
        if is_inplace_op(func) and args and isinstance(args[0], torch.Tensor):
            if any(st.data_ptr() in self.saved_storages for st in storages_of(args[0])):
                decision = 1
        if decision:
            self.saved_storages.update(st.data_ptr() for st in storages_of(output))
        return decision


def planned_modules(model: torch.nn.Module) -> list[ModulePlan]:
    """The plans :func:`estimators.apply_plan` put on the model's modules, in module order."""
    return [mod.__dict__[PLAN_MARK] for mod in model.modules() if PLAN_MARK in mod.__dict__]

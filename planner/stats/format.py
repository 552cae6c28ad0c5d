"""Stats format v1: what a collector measured about one training step.

One document per collected model. The planner, the service and the collector
all use these models; nothing else defines the format.

Units live in the names: ``*_bytes`` are bytes, ``*_ms`` are milliseconds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, StrictBool, field_validator, model_validator

from planner.ops.groups import op_groups
from planner.stats.op_format import (MAX_BYTES, Bytes, Millis, OpStats, StrictModel, Whole, compact_ops,
                                    with_runtime)
from planner.stats.orders import check_contiguous, check_order, check_sibling_order, innermost_prefix_module
from planner.stats.metadata import StatsMetadata
from planner.stats.sharding import Sharding
from planner.stats.text import Text

__all__ = [
    "STATS_FORMAT",
    "MAX_BYTES",
    "Bytes",
    "Millis",
    "OpStats",
    "ModuleStats",
    "Moment",
    "Sharding",
    "StatsMetadata",
    "Stats",
    "stats_hash",
]

STATS_FORMAT = "sacplan.stats/v1"

class ModuleStats(StrictModel):
    """Memory and time figures of one module (``nn.Module`` instance) in the step."""

    fqn: Text = Field(min_length=1, max_length=1024, examples=["Transformer.layers.0"])
    parent: Text | None = Field(None, description="fqn of the enclosing module; null for the root.")
    is_leaf: StrictBool = Field(description="Module has no submodules; leaf modules are never checkpointed.")
    param_bytes: Bytes = 0
    grad_bytes: Bytes = 0
    act_saved_bytes: Bytes = Field(0, description="IA: activation memory autograd saves inside the module (not its input or output).")
    act_total_bytes: Bytes = Field(0, description="TA: all activation memory live when the module's forward ends.")
    act_grad_bytes: Bytes = Field(0, description="AG: activation-gradient memory at the module's backward peak.")
    act_bw_bytes: Bytes | None = Field(None, description="Activation memory live at the module's backward peak, if known.")
    grad_total_bytes: Bytes = Field(0, description="TG: gradient memory accumulated up to and including this module's backward.")
    input_bytes: Bytes = 0
    output_bytes: Bytes = 0
    optimizer_state_bytes: Bytes = Field(0, description="Optimizer state of this module's own parameters (root: all of it).")
    fw_ms: Millis = 0.0
    bw_ms: Millis = 0.0
    force_store_random: StrictBool = Field(False, description="Random ops of this module must be saved.")
    held_input_bytes: Bytes = Field(0, description="Bytes of the module's inputs that checkpointing keeps alive "
                                    "until its backward although the step without it frees them sooner (no op "
                                    "saves them for backward): they offset what checkpointing the module frees.")
    held_inputs: list[tuple[Bytes, Bytes]] | None = Field(None, description="(tensor number, bytes) of each input "
        "in held_input_bytes, if known. A number in several modules is one tensor (an attention mask every layer "
        "takes): held once, however many of them are checkpointed.")
    calls: Whole = Field(1, ge=1, le=2**31, description="Forward calls of the module in the step (a shared layer "
                       "applied several times): checkpointing it recomputes every call. The other figures describe "
                       "the first call (calls of one module in a step are alike: see docs/memory-model.md).")
    chained_calls: tuple[Annotated[Whole, Field(ge=0, le=2**31)], Bytes] | None = Field(
        None, exclude_if=lambda v: v is None, description="(op index, bytes) when every later call takes, as an "
        "input checkpointing holds, the tensor (of these bytes) that op made in the call before (a layer applied in a chain, x = layer(x)): "
        "checkpointed with that op saved, each call's saved output and the next call's held input are one tensor.")
    checkpoint_overhead_ms: Millis | None = Field(
        None, description="What checkpointing the module costs beyond recomputing its ops: re-running its forward "
        "code and the policy for every op, saved or not. Measured by `sacplan collect --benchmark`, else estimated "
        "from the op count; null: not known (counted as 0). Measured: with every op but views saved.")
    recompute_op_count: Whole | None = Field(None, ge=0, le=2**31, description="How many of its first ops a "
        "recompute re-runs (torch.utils.checkpoint stops once it has every tensor autograd saved); null: all.")
    saved_op_overhead_ms: Millis | None = Field(None, description="What saving an op costs over recomputing it "
        "(caching its output), measured by --benchmark: a recomputed op costs its runtime less this, at least 0.")
    recompute_key: Whole | None = Field(None, ge=0, le=2**31, exclude_if=lambda v: v is None, description="Checkpointed, "
        "the key of the backward moment its recompute runs in (where the backward first unpacks a tensor its "
        "forward saved); null: not known (recompute temporaries not counted).")
    recompute_headroom_bytes: Bytes | None = Field(None, exclude_if=lambda v: v is None, description="How far the "
        "live memory when its recompute runs lies below the most of its recompute_key moment: what a recompute "
        "holds beyond the backward's memory counts only past this.")
    ops: list[OpStats] | None = Field(
        None, description="Forward ops of a non-leaf module in execution order; null when not collected."
    )
    _recompute_cache: tuple | None = PrivateAttr(default=None)
    _runtimes_cache: tuple | None = PrivateAttr(default=None)

    @field_validator("ops", mode="before")
    @classmethod
    def _compact_ops(cls, ops: Any) -> Any:
        # hundreds of thousands of ops in a large document: made without a pydantic call each where they can be
        return compact_ops(ops)

    @property
    def op_bytes(self) -> int:
        """ACM: bytes of every op output in the module."""
        return sum(op.output_bytes for op in self.ops or ())

    @property
    def op_ms(self) -> float:
        """Recompute time of every op in the module (their runtimes, see :attr:`recompute_ops`)."""
        return sum(self.recompute_runtimes_ms)

    @property
    def recompute_ops(self) -> list[OpStats] | None:
        """``ops`` priced as plans are: ``runtime_ms`` what recomputing each costs (0 past ``recompute_op_count``,
        else the runtime less ``saved_op_overhead_ms``, at least 0; views keep theirs)."""
        if self.ops is None or (self.recompute_op_count is None and not self.saved_op_overhead_ms):
            return self.ops
        if (ms := self.recompute_runtimes_ms) is not (self._recompute_cache or (None,))[0]:  # priced anew
            self._recompute_cache = (ms, [op if op.view_like else with_runtime(op, t)
                                          for op, t in zip(self.ops, ms)])
        return self._recompute_cache[1]

    @property
    def recompute_runtimes_ms(self) -> list[float]:
        """The ``runtime_ms`` of each of :attr:`recompute_ops`, without copying the ops."""
        ops = self.ops or []
        key = (id(self.ops), len(ops), self.recompute_op_count, self.saved_op_overhead_ms)
        if self._runtimes_cache is None or self._runtimes_cache[0] != key:
            stop = len(ops) if self.recompute_op_count is None else self.recompute_op_count
            less = self.saved_op_overhead_ms or 0.0
            self._runtimes_cache = (key, [op.runtime_ms if op.view_like else
                                          max(0.0, (op.runtime_ms if i < stop else 0.0) - less)
                                          for i, op in enumerate(ops)])
        return self._runtimes_cache[1]


def _none(counts: dict) -> bool:
    """Empty per-call counts are left out of a document: absent means none, so documents of modules called once
    (and older ones) keep their text and hash."""
    return not counts


class Moment(StrictModel):
    """Live memory at one moment of the collected step where the step's peak can occur.

    The collector keeps, per phase and per ``key``, the instant of most live
    memory. ``key`` says which checkpointing discards are in effect then: those
    of the modules at ``fw_post_order`` positions below it (in forward: the
    modules that have finished; in backward: at most the first module whose
    backward has started; at the optimizer step: none).
    """

    phase: Literal["forward", "backward", "optimizer"]
    key: Whole = Field(ge=0, le=2**31, description="Discards of the modules at fw_post_order positions below this "
                                                "apply at this moment.")
    module: Text | None = Field(None, max_length=1024, description="The module running at that instant, if any.")
    activation_bytes: Bytes = Field(description="Everything live but parameters, gradients and optimizer memory: "
                                                "activations, backward temporaries, model inputs, buffers.")
    grad_bytes: Bytes = Field(0, description="Parameter gradients live at that instant.")
    optimizer_bytes: Bytes = Field(0, description="Optimizer memory live at that instant (state and the step's "
                                                  "temporaries); 0 before the first optimizer step.")
    micro_batch: Whole | None = Field(None, ge=1, le=4096, exclude_if=lambda v: v is None, description="With "
                                    "gradient accumulation (metadata.grad_accumulation): the micro-batch of a "
                                    "forward or backward moment, from 1. Absent: the only one, or the optimizer step.")
    repeat_calls_discarding: dict[Annotated[Text, Field(max_length=1024)], Annotated[Whole, Field(ge=1, le=2**31)]] = \
        Field(default_factory=dict, max_length=4096, exclude_if=_none,
              description="Modules called more than once in the step: per "
              "module, how many of its calls after the first have finished their forward and not started their "
              "backward at that instant (checkpointed, each discards as the first does). The key covers the first "
              "call; a module absent here has none.")
    repeat_calls_in_backward: dict[Annotated[Text, Field(max_length=1024)], Annotated[Whole, Field(ge=1, le=2**31)]] = \
        Field(default_factory=dict, max_length=4096, exclude_if=_none,
              description="Per module called more than once: how many of its "
              "calls after the first are in their own backward at that instant (checkpointed, each holds its inputs "
              "then).")


class Stats(StrictModel):
    """A stats v1 document: one model's training step, module by module."""

    format: Literal["sacplan.stats/v1"] = STATS_FORMAT
    metadata: StatsMetadata
    fw_pre_order: list[str] = Field(description="Module fqns in forward pre-order (root first).")
    fw_post_order: list[str] = Field(description="Module fqns in forward post-order (root last).")
    modules: list[ModuleStats] = Field(min_length=1)
    timeline: list[Moment] | None = Field(None, max_length=2**22, description="The step's memory at the moments its peak can occur (sacplan's collector writes it). With it "
        "the planner follows the step (memory_model 'step'); without it (PyTorch's format, older uploads) it plans "
        "under PyTorch's sac_milp model (memory_model 'torch').")

    _index: dict[str, ModuleStats] | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check_consistency(self) -> Stats:
        _validate(self)
        return self

    # Derived lookups; cheap and not part of the document.
    def module(self, fqn: str) -> ModuleStats:
        """The module with this fqn (KeyError if absent)."""
        private = self.__pydantic_private__  # read directly: a private attribute's lookup is slow in a hot path
        if (index := private.get("_index")) is None:
            index = private["_index"] = {m.fqn: m for m in self.modules}
        return index[fqn]

    @property
    def root(self) -> ModuleStats:
        return self.module(self.fw_pre_order[0])

    def canonical_json(self) -> str:
        """Key-sorted compact JSON: equal documents give equal text."""
        return "".join(self.canonical_json_parts())

    def canonical_json_parts(self) -> Iterator[str]:
        """:meth:`canonical_json` in pieces, a module at a time, for a writer that needs no whole copy of it."""
        # json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":")), a module at a time: the
        # whole dump of a large document is several times its text in Python objects
        top = self.model_dump(mode="json", exclude={"modules"})
        top["modules"] = None
        for k, key in enumerate(sorted(top)):
            yield ("{" if k == 0 else ",") + json.dumps(key) + ":"
            if key != "modules":
                yield _canonical(top[key])
                continue
            for j, m in enumerate(self.modules):
                yield ("[" if j == 0 else ",") + _canonical(m.model_dump(mode="json"))
            yield "]"
        yield "}"


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def short_value(v: Any) -> Any:
    """A value as error messages quote it: containers by their size, long text cut."""
    if isinstance(v, (list, tuple, Mapping)) and (len(v) > 4 or len(repr(v)) > 60):
        return f"<{type(v).__name__} of {len(v)}>"
    if isinstance(v, str):
        v = v.encode("utf-8", "backslashreplace").decode("utf-8")  # a lone surrogate shown as \\ud800
        return v if len(v) <= 80 else v[:77] + "..."
    return v


def stats_hash(stats: Stats) -> str:
    """SHA-256 of the canonical document: the identity of a stats upload."""
    return hashlib.sha256(stats.canonical_json().encode()).hexdigest()


def _validate(s: Stats) -> None:
    index: dict[str, int] = {}
    for i, m in enumerate(s.modules):
        if m.fqn in index:
            raise ValueError(f"modules[{i}].fqn {m.fqn!r} duplicates modules[{index[m.fqn]}]")
        index[m.fqn] = i
    check_order("fw_pre_order", s.fw_pre_order, index)
    check_order("fw_post_order", s.fw_post_order, index)
    if s.metadata.sharding is not None:
        for k, u in enumerate(s.metadata.sharding.units):
            if u not in index:
                raise ValueError(f"metadata.sharding.units[{k}] {u!r} is not a module fqn")

    pre = {f: k for k, f in enumerate(s.fw_pre_order)}
    post = {f: k for k, f in enumerate(s.fw_post_order)}
    roots = [i for i, m in enumerate(s.modules) if m.parent is None]
    if len(roots) != 1:
        names = [s.modules[i].fqn for i in roots]
        raise ValueError(f"modules must have exactly one root (parent null), found {len(roots)}: {names[:5]}")
    root = s.modules[roots[0]].fqn
    if s.fw_pre_order[0] != root:
        raise ValueError(f"fw_pre_order[0] {s.fw_pre_order[0]!r} is not the root module {root!r}")
    if s.fw_post_order[-1] != root:
        raise ValueError(f"fw_post_order[-1] {s.fw_post_order[-1]!r} is not the root module {root!r}")

    has_children: set[str] = set()
    for i, m in enumerate(s.modules):
        if m.parent is None:
            continue
        if m.parent not in index:
            raise ValueError(f"modules[{i}].parent {m.parent!r} is not a module fqn")
        if not m.fqn.startswith(m.parent + "."):
            raise ValueError(f"modules[{i}].parent {m.parent!r} is not a prefix module of {m.fqn!r}")
        inner = innermost_prefix_module(m.fqn, index)
        if inner != m.parent:
            # nesting (which checkpoints contain which) follows the parent links: one that skips a
            # level would let a module and the module really enclosing it both be checkpointed
            raise ValueError(f"modules[{i}].parent {m.parent!r} is not the innermost module enclosing "
                             f"{m.fqn!r}: {inner!r} is a module too")
        if pre[m.parent] > pre[m.fqn] or post[m.parent] < post[m.fqn]:
            raise ValueError(
                f"modules[{i}] {m.fqn!r} does not lie inside its parent {m.parent!r} in fw_pre_order/fw_post_order"
            )
        has_children.add(m.parent)

    check_contiguous(s, pre, post)
    check_sibling_order(s, pre, post)
    held: dict[int, int] = {}
    consistent: set[tuple] = set()
    for i, m in enumerate(s.modules):
        if m.is_leaf and m.fqn in has_children:
            raise ValueError(f"modules[{i}].is_leaf is true but {m.fqn!r} has submodules")
        if m.is_leaf and m.ops is not None:
            raise ValueError(f"modules[{i}].ops: {m.fqn!r} is a leaf module, which is never checkpointed; "
                             f"op lists belong to non-leaf modules (give null)")
        if m.ops is not None:
            _check_ops(f"modules[{i}]", m, consistent)
        if m.held_inputs is not None and (total := sum(b for _, b in m.held_inputs)) != m.held_input_bytes:
            raise ValueError(f"modules[{i}].held_inputs add up to {total} bytes, not held_input_bytes "
                             f"{m.held_input_bytes}")
        if m.chained_calls is not None:
            _check_chained_calls(f"modules[{i}]", m)
        for number, nbytes in m.held_inputs or ():
            if held.setdefault(number, nbytes) != nbytes:
                raise ValueError(f"modules[{i}].held_inputs: tensor {number} has {nbytes} bytes here and "
                                 f"{held[number]} in an earlier module")
    for i, m in enumerate(s.modules):
        for k, op in enumerate(m.ops or ()):
            for number in op.held_tensors or ():
                if number not in held:
                    raise ValueError(f"modules[{i}].ops[{k}].held_tensors: tensor {number} is in no module's "
                                     f"held_inputs")
    _check_timeline(s, index)


def _check_timeline(s: Stats, index: dict[str, int]) -> None:
    if s.timeline is None:
        return
    if not s.timeline:
        raise ValueError("timeline is empty: give null when the moments are not known")
    n = len(s.modules)
    for k, t in enumerate(s.timeline):
        if t.key > n:
            raise ValueError(f"timeline[{k}].key {t.key} is past the {n} modules of fw_post_order")
        if t.micro_batch is not None and (t.phase == "optimizer" or t.micro_batch > (s.metadata.grad_accumulation or 1)):
            raise ValueError(f"timeline[{k}].micro_batch {t.micro_batch} is not a micro-batch of the {t.phase} "
                             f"(metadata.grad_accumulation {s.metadata.grad_accumulation})")
        if t.module is not None and t.module not in index:
            raise ValueError(f"timeline[{k}].module {short_value(t.module)!r} is not a module fqn")
        for name in ("repeat_calls_discarding", "repeat_calls_in_backward"):
            for fqn, count in getattr(t, name).items():
                if fqn not in index:
                    raise ValueError(f"timeline[{k}].{name} names {short_value(fqn)!r}, which is not a module fqn")
                if count >= s.modules[index[fqn]].calls:
                    raise ValueError(f"timeline[{k}].{name}[{short_value(fqn)!r}] is {count}, but the module has "
                                     f"only {s.modules[index[fqn]].calls - 1} calls after its first (calls)")


def _check_chained_calls(where: str, m: ModuleStats) -> None:
    op, nbytes = m.chained_calls
    if m.calls < 2:
        raise ValueError(f"{where}.chained_calls is set but the module has calls {m.calls}: no later call to chain")
    if m.ops is None or op >= len(m.ops):
        raise ValueError(f"{where}.chained_calls op {op} is out of range for {len(m.ops or ())} ops")
    if nbytes > m.ops[op].output_bytes:
        raise ValueError(f"{where}.chained_calls: {nbytes} bytes is more than ops[{op}].output_bytes "
                         f"{m.ops[op].output_bytes}")


def _check_ops(where: str, m: ModuleStats, consistent: set[tuple]) -> None:
    ops = m.ops or []
    n = len(ops)
    if (m.recompute_op_count or 0) > n:
        raise ValueError(f"{where}.recompute_op_count {m.recompute_op_count} is more than its {n} ops")
    for k, op in enumerate(ops):
        p = op.inplace_parent
        if p is not None and p >= n:
            raise ValueError(f"{where}.ops[{k}].inplace_parent {p} is out of range for {n} ops")
        if p is not None and p > k:
            raise ValueError(f"{where}.ops[{k}].inplace_parent {p} comes after the op itself")
        if op.unsaved_last_ops is not None and len(op.unsaved_last_ops) != len(op.storages or ()):
            raise ValueError(f"{where}.ops[{k}].unsaved_last_ops has {len(op.unsaved_last_ops)} entries for "
                             f"{len(op.storages or ())} storages")
        for j in op.compiled_takers or ():
            if not k < j < n:
                raise ValueError(f"{where}.ops[{k}].compiled_takers: {j} is not a later op of the {n}")
    # The SAC conventions must leave every op a consistent decision. They read only the flags and the parents,
    # so an op list like one already checked (every block of a stack has the same) passes without a second look.
    shape = (m.force_store_random, *((op.view_like, op.random, op.inplace_parent) for op in ops))
    if shape in consistent:
        return
    try:
        op_groups(ops, m.force_store_random)
    except ValueError as exc:
        raise ValueError(f"{where}.ops: {exc}") from None
    consistent.add(shape)

"""The number types of the stats format, and one op (``OpStats``), with a compact way to make many of them.

A stats document has hundreds of thousands of ops (one transformer block's
forward is a few dozen; tens of thousands of blocks in the largest uploads).
Validated one pydantic call each they cost about 1.1 KiB and 10 microseconds
apiece (two Python validators per op, and a set of the fields given), 23 times
the document's size in memory. :func:`compact_op` checks the common case (a
name, a runtime, a byte count, flags) in plain Python and makes the op without
pydantic's per-instance overhead: about 240 bytes and 2 microseconds; whatever
it does not recognise it leaves to the model's own validation, so a document is
accepted, refused and worded exactly as before.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool

from planner.stats.text import Text

__all__ = ["MAX_BYTES", "Bytes", "Whole", "Millis", "StrictModel", "OpStats", "CompactOps", "compact_ops",
           "OP_FIELDS", "with_runtime"]

# 2**62 keeps every byte count (and sums of a few thousand of them) inside a
# signed 64-bit database integer.
MAX_BYTES = 2**62
MAX_MS = 1e12


def _a_number(v: Any) -> Any:
    """JSON numbers only: true/false and numeric text are not byte counts or times."""
    if isinstance(v, (bool, str, bytes)):
        raise ValueError(f"must be a number, got {v!r}")
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"must be a finite number, got {v!r}")
    return v


# Whole bytes; 12.0 is accepted (JSON writers may emit it), 12.5, true and "12" are not.
Bytes = Annotated[int, BeforeValidator(_a_number), Field(ge=0, le=MAX_BYTES)]
Whole = Annotated[int, BeforeValidator(_a_number)]  # an index or a count: a JSON number, never true/false or text
Millis = Annotated[float, BeforeValidator(_a_number), Field(ge=0.0, le=MAX_MS, allow_inf_nan=False)]


class StrictModel(BaseModel):
    """The stats format's models: unknown fields are errors."""

    model_config = ConfigDict(extra="forbid", frozen=False)


class OpStats(StrictModel):
    """One ATen op run in a module's forward pass, as SAC sees it."""

    name: Text = Field(min_length=1, max_length=512, examples=["aten.mm"])
    runtime_ms: Millis = Field(description="Estimated or measured runtime of the op.")
    output_bytes: Bytes = Field(description="Bytes of the op's outputs that SAC would keep if the op is saved.")
    view_like: StrictBool = Field(False, description="Output aliases an input: always recomputed.")
    random: StrictBool = Field(False, description="Op draws random numbers (dropout): random ops are saved or recomputed together.")
    inplace_parent: Whole | None = Field(None, ge=0, description="For an in-place op, the index of the op that "
        "produced the tensor it mutates (its own index when it mutates a module input: then it is always saved); "
        "for an op returning a storage an earlier op made (_unsafe_view), that op's index (the two share one "
        "decision).")
    saved_by_autograd: StrictBool = Field(False, description="Autograd saves this op's output for backward.")
    must_save: StrictBool | None = Field(None, exclude_if=lambda v: not v, description="True: the op is "
        "communication (a tensor-parallel collective or its wait: planner.ops.groups' MUST_SAVE_OPS) and is never "
        "recomputed: a recompute would communicate again. Every engine and apply save it. Null: false.")
    held_tensors: list[Bytes] | None = Field(
        None, max_length=64, exclude_if=lambda v: v is None, description="Tensor numbers (as in held_inputs) "
        "of this op's outputs that some module holds as an input (a module's output that the next module takes): "
        "while both are checkpointed and this op is saved, one tensor. Null: none, or not known.")
    storages: list[tuple[Bytes, Annotated[Whole, Field(ge=0, le=2**31)], StrictBool]] | None = Field(
        None, max_length=64, exclude_if=lambda v: v is None, description="(bytes, last op, saved) of each storage "
        "this op made in the forward: its bytes, the index of the module's last op run while it was live (the "
        "module's op count: it outlived them), whether an op of this module saved it for backward (the module's "
        "output that only later modules save is not: the plain step has freed it when this module's backward "
        "starts). A recompute holds each as long (or to its "
        "early stop): what it holds beyond the backward's memory is added at recompute_key. Null: not known.")
    unsaved_last_ops: list[Annotated[Whole, Field(ge=0, le=2**31)]] | None = Field(
        None, max_length=64, exclude_if=lambda v: v is None, description="Per storage of storages (same order), "
        "the index of the module's last op run while it was live in a forward whose autograd saved nothing (the "
        "module's op count: it outlived them): when it dies under checkpointing if this op is recomputed. Null: "
        "not known.")
    forward_key: Whole | None = Field(None, ge=0, le=2**31, exclude_if=lambda v: v is None, description="The key "
        "of the forward moment (timeline) the op runs in: how many modules of fw_post_order had finished. Null: "
        "not known.")
    forward_live_bytes: Bytes | None = Field(None, exclude_if=lambda v: v is None, description="The most live "
        "bytes but parameters, gradients and optimizer state of the step without checkpointing from the op before "
        "to this op's outputs (as the timeline's activation_bytes): with forward_key and unsaved_last_ops, a "
        "checkpointed module's own forward moments (docs/memory-model.md). Null: not known.")
    compiled_takers: list[Annotated[Whole, Field(ge=0)]] | None = Field(
        None, max_length=4096, exclude_if=lambda v: v is None, description="Stats of a step compiled with "
        "aot_eager: the indices of the later ops of this module that take this op's outputs and may be recomputed "
        "(not views, random ops, or the op making the module's output autograd saves). The compiled backward "
        "reads an op's outputs only where a storage is saved (storages) or saved_by_autograd, or a taker it "
        "recomputes needs them: a plan offloads no op it would not read. Null: not known (eager stats).")


OP_FIELDS = ("name", "runtime_ms", "output_bytes", "view_like", "random", "inplace_parent", "saved_by_autograd")
_OP_KEYS = frozenset(OP_FIELDS)
_new_op = OpStats.__new__
_set = object.__setattr__


class CompactOps:
    """Makes the ops of one module or document without a pydantic call per op (see the module's docstring).

    Each name is checked once and its one string shared by every op that has it;
    the ops made share one set of the fields given per kind of input (pydantic's
    ``model_fields_set``; assigning a field of such an op, which nothing does,
    would mark it set in all of them).
    """

    def __init__(self) -> None:
        self._names: dict[str, str] = {}
        self._fields_set: dict[frozenset[str], set[str]] = {}

    def op(self, name: Any, runtime_ms: Any, output_bytes: Any, view_like: Any = False, random: Any = False,
           inplace_parent: Any = None, saved_by_autograd: Any = False, *,
           given: frozenset[str] = _OP_KEYS) -> OpStats | None:
        """The op OpStats(**fields) would be, when every value is one it accepts unchanged (or an int runtime, as
        a float); else None: validate it with the model, which accepts or words the error."""
        name = self._name(name)
        kind = type(runtime_ms)
        if kind is int:
            runtime_ms = float(runtime_ms) if 0 <= runtime_ms <= MAX_MS else None
        elif kind is not float or not 0.0 <= runtime_ms <= MAX_MS:  # NaN fails the comparison too
            runtime_ms = None
        if (name is None or runtime_ms is None or type(output_bytes) is not int
                or not 0 <= output_bytes <= MAX_BYTES or (view_like is not True and view_like is not False)
                or (random is not True and random is not False)
                or (saved_by_autograd is not True and saved_by_autograd is not False)
                or (inplace_parent is not None and (type(inplace_parent) is not int or inplace_parent < 0))):
            return None
        op = _new_op(OpStats)
        _set(op, "name", name)
        _set(op, "runtime_ms", runtime_ms)
        _set(op, "output_bytes", output_bytes)
        _set(op, "view_like", view_like)
        _set(op, "random", random)
        _set(op, "inplace_parent", inplace_parent)
        _set(op, "saved_by_autograd", saved_by_autograd)
        _set(op, "must_save", None)
        _set(op, "held_tensors", None)
        _set(op, "storages", None)
        _set(op, "unsaved_last_ops", None)
        _set(op, "forward_key", None)
        _set(op, "forward_live_bytes", None)
        _set(op, "compiled_takers", None)
        if (fields_set := self._fields_set.get(given)) is None:
            fields_set = self._fields_set[given] = set(given)
        _set(op, "__pydantic_fields_set__", fields_set)
        _set(op, "__pydantic_extra__", None)
        _set(op, "__pydantic_private__", None)
        return op

    def from_json(self, value: Any) -> Any:
        """The op a decoded JSON object describes, or ``value`` itself when the model must validate it (other
        fields such as ``storages``, a value it would convert or refuse)."""
        if type(value) is not dict or not value.keys() <= _OP_KEYS:
            return value
        try:
            name, runtime_ms, output_bytes = value["name"], value["runtime_ms"], value["output_bytes"]
        except KeyError:
            return value
        op = self.op(name, runtime_ms, output_bytes, value.get("view_like", False), value.get("random", False),
                     value.get("inplace_parent"), value.get("saved_by_autograd", False), given=frozenset(value))
        return value if op is None else op

    def _name(self, v: Any) -> str | None:
        if type(v) is not str:
            return None
        if (known := self._names.get(v)) is not None:
            return known
        if not 0 < len(v) <= 512:
            return None
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return None
        self._names[v] = v
        return v


def with_runtime(op: OpStats, runtime_ms: float) -> OpStats:
    """``op.model_copy(update={"runtime_ms": runtime_ms})`` without pydantic's copy of each of its parts (a
    plan prices every op of the model-spanning modules anew: thousands of copies). The copy shares ``op``'s set
    of the fields given, which already holds the required ``runtime_ms``."""
    new = _new_op(type(op))
    values = op.__dict__.copy()
    values["runtime_ms"] = runtime_ms
    _set(new, "__dict__", values)
    _set(new, "__pydantic_fields_set__", op.__pydantic_fields_set__)
    _set(new, "__pydantic_extra__", None)
    _set(new, "__pydantic_private__", None)
    return new


def compact_ops(values: Any) -> Any:
    """A module's ``ops`` as decoded from JSON, each op made by :class:`CompactOps` where it can be (the others
    left for the model to validate); anything but a list unchanged."""
    if type(values) is not list:
        return values
    maker = CompactOps()
    return [v if isinstance(v, OpStats) else maker.from_json(v) for v in values]

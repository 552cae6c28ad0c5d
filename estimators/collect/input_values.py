"""The batch's values under fake tensors, so model code that branches on them takes the real batch's path.

Fake tensors carry shapes, never values. Model code that reads its inputs
(an all-ones attention mask dropped, padding detected, per-row lengths read
with ``.item()`` or ``nonzero``) would either fail under fake tensors or, as
Hugging Face's mask code does, take the path of a traced run, which the real
batch does not take: the stats then describe ops the training step never
runs, and a plan made from them cannot apply.

So the inputs a factory makes with real values (on the CPU) keep them: each
fake input is paired with its real tensor, and :class:`InputValues`, a
dispatch mode just above the fake mode, runs every forward op whose tensor
arguments all have values on those values too (on the CPU, outside any
tracking: nothing of it is in the stats), as do small factory ops
(``arange``, ``ones``). A read (``.item()``, ``bool(t)``, ``torch.equal``)
of a tensor with a value gets the real answer, and an op whose output shape
depends on values (``nonzero``, ``masked_select``) gets fake outputs of the
real shapes. Parameters and buffers never have values (they may be on
``meta``), so following stops where the batch meets the weights, which is
where data-dependent model code ends in practice. A read of a tensor without
a value fails as fake tensors do, with an error saying how to give it one.
The MoE routing the collector assumes (:mod:`estimators.collect.moe`) is
followed the same way, from the values it gives ``topk``'s indices; reads of
those are not the batch's and are not recorded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import torch
from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException,
                                           is_fake, unset_fake_temporarily)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakTensorKeyDictionary

from estimators.common import BATCH_VALUES_TAG, UNKNOWN_VALUES_TAG, op_name, written_tensors

__all__ = ["InputValues", "tag_batch_values",
           "FACTORY_VALUE_ELEMENTS", "VALUE_ELEMENTS", "attach", "has_value", "unanswered_read_error",
           "value_of"]

# Values followed per op output, at most: a mask expanded to (batch, 1, seq, seq) fits at seq 8192 (bool).
VALUE_ELEMENTS = 1 << 26
# Factory ops (no tensor argument: arange, ones, full) get values only this small: positions, lengths, expert ids.
FACTORY_VALUE_ELEMENTS = 1 << 22

_VALUES = WeakTensorKeyDictionary()  # fake tensor -> its real value (on the CPU)
_FROM_BATCH = WeakTensorKeyDictionary()  # fake tensor -> True where its value derives from the batch


def value_of(t: Any) -> torch.Tensor | None:
    """The real value a fake tensor carries, or None."""
    return _VALUES.get(t) if isinstance(t, torch.Tensor) else None


def has_value(t: Any, *, from_batch: bool = False) -> bool:
    """Whether ``t`` is a fake tensor with a value (``from_batch``: one derived from the batch, not a factory op)."""
    if not isinstance(t, torch.Tensor) or t not in _VALUES:
        return False
    return not from_batch or bool(_FROM_BATCH.get(t))


def attach(fake: torch.Tensor, real: torch.Tensor, *, from_batch: bool) -> None:
    """Pair a fake tensor with its real value (``from_batch``: the value derives from the batch)."""
    _VALUES[fake] = real
    _FROM_BATCH[fake] = from_batch


class InputValues(TorchDispatchMode):
    """Runs the forward's batch-derived ops on real values too; answers reads from them (see the module doc).

    Enter it just above the fake mode (below the modes that record ops, so
    they see a read as the real run's policy does); it acts only while
    ``active``. ``reads`` lists the reads answered, ``unanswered`` the reads
    of tensors without a value, ``unknown`` the questions about values the
    model asked some other way and took the traced path for (Hugging Face's
    ``is_tracing`` on a mask without a value).
    """

    def __init__(self) -> None:
        super().__init__()
        self.active = False
        self.reads: list[str] = []
        self.unanswered: list[str] = []
        self.unknown: list[str] = []

    @contextlib.contextmanager
    def activated(self) -> Iterator[InputValues]:
        """This mode entered and acting, for one more run of the forward (the compiled step's probe)."""
        self.active = True
        try:
            with self:
                yield self
        finally:
            self.active = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.active:
            return func(*args, **kwargs)
        flat = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        known = all(has_value(x) for x in flat)
        try:
            out = func(*args, **kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException):
            if not (flat and known):
                self.unanswered.append(op_name(func))
                raise
            return self._answer(func, args, kwargs, flat)
        if not known:  # a tensor with a value written from one without: its value is gone
            for x in written_tensors(func, args, kwargs):
                _VALUES.pop(x, None)
        elif self._small(out, bool(flat)):
            real = self._run(func, args, kwargs)
            self._pair(out, real, from_batch=any(has_value(x, from_batch=True) for x in flat))
        return out

    @staticmethod
    def _small(out: Any, has_tensor_args: bool) -> bool:
        limit = VALUE_ELEMENTS if has_tensor_args else FACTORY_VALUE_ELEMENTS
        ts = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        return bool(ts) and all(is_fake(t) and t.numel() <= limit for t in ts)

    @staticmethod
    def _run(func: Any, args: tuple, kwargs: dict) -> Any:
        """The op on the values, on the CPU, with no mode active."""
        def real(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                return value_of(x)
            return torch.device("cpu") if isinstance(x, torch.device) else x

        r_args, r_kwargs = tree_map(real, args), tree_map(real, kwargs)
        if "device" in r_kwargs:
            r_kwargs["device"] = torch.device("cpu")
        with unset_fake_temporarily(), ExitStack() as stack:
            if torch.Tag.nondeterministic_seeded in func.tags:  # the user's RNG is not the collection's to draw from
                stack.enter_context(torch.random.fork_rng(devices=[]))
            return func(*r_args, **r_kwargs)

    @staticmethod
    def _pair(out: Any, real: Any, *, from_batch: bool) -> None:
        fakes, reals = tree_flatten(out)[0], tree_flatten(real)[0]
        for f, r in zip(fakes, reals):
            if isinstance(f, torch.Tensor) and isinstance(r, torch.Tensor) and f.shape == r.shape:
                attach(f, r, from_batch=from_batch)

    def _answer(self, func: Any, args: tuple, kwargs: dict, flat: list[torch.Tensor]) -> Any:
        """A read's real answer, or fake outputs of the real shapes for an op whose shapes depend on values."""
        from_batch = any(has_value(x, from_batch=True) for x in flat)
        if from_batch:  # the batch's, not an assumed MoE routing's
            self.reads.append(op_name(func))
        real = self._run(func, args, kwargs)
        if not any(isinstance(r, torch.Tensor) for r in tree_flatten(real)[0]):
            return real  # a Python scalar (item, bool, equal)
        device = flat[0].device

        def fake_like(r: Any) -> Any:
            if not isinstance(r, torch.Tensor):
                return r
            f = torch.empty_strided(r.shape, r.stride(), dtype=r.dtype, device=device)  # the fake mode below
            attach(f, r, from_batch=from_batch)
            return f

        return tree_map(fake_like, real)


def unanswered_read_error(exc: BaseException, values: InputValues) -> ValueError | None:
    """A clear error for a read of a tensor without a value (the model branches on it), or None."""
    if not isinstance(exc, (DataDependentOutputException, DynamicOutputShapeException)):
        return None
    what = values.unanswered[-1] if values.unanswered else str(exc)
    return ValueError(
        f"the model reads the values of a tensor ({what}) that has none under fake tensors: its code branches "
        f"on data. The collector follows the values of the batch and of the routing it assumes for "
        f"mixture-of-experts layers, through the ops that do not touch the weights: make the inputs the factory "
        f"returns real tensors on the CPU (not on `device`, which is meta), with the values of a training batch "
        f"(e.g. its attention mask), or make the shape independent of the data")


def tag_batch_values(stats: Any, values: InputValues) -> None:
    """Tag the stats with the reads of the batch's values the step made: answered (the stats follow this batch's
    path through data-dependent model code), and asked of values the batch did not have (made on meta)."""
    if values.reads:
        stats.metadata.tags[BATCH_VALUES_TAG] = _counted(values.reads)
    if values.unknown:
        stats.metadata.tags[UNKNOWN_VALUES_TAG] = _counted(values.unknown)


def _counted(names: list[str]) -> str:
    """``aten.all x2, aten._local_scalar_dense x2``: each name once, in order of first appearance."""
    counts = {n: names.count(n) for n in dict.fromkeys(names)}
    return ", ".join(f"{n} x{c}" for n, c in counts.items())

"""The collector's module events: forward pre/post of every module, backward spans through multi-grad hooks.

``col`` is the collector's dispatch mode (its ``phase``, forward stack, open
backward spans and timeline); ``mods`` maps each module to its record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from estimators.collect.overhead import call_spec
from estimators.collect.repeat_calls import RepeatCalls
from estimators.common import ACT, GRAD, TEMP, StorageBook, autocast_name, storages_of, tensors_in

__all__ = ["ModuleHooks"]

Progress = Callable[[str, int, int], None]


def _live_act(book: StorageBook) -> int:
    return book.live[ACT]


class ModuleHooks:
    """Forward pre/post and backward pre/post events of every module of the model."""

    def __init__(self, col: Any, book: StorageBook, mods: dict[nn.Module, Any], progress: Progress | None,
                 *, capture_calls: bool = False):
        self.col, self.book, self.mods, self.progress = col, book, mods, progress
        self.capture_calls = capture_calls
        self.pre_order: list[str] = []
        self.post_order: list[str] = []
        self._repeat: list[bool] = []
        self._later_inputs: list[dict[int, int]] = []  # the inputs of each later call running
        self._seen: set[str] = set()
        self._handles: list[Any] = []
        self.repeats = RepeatCalls(book, col.timeline)
        # what progress counts toward: containers (ModuleList, ModuleDict) have no forward of their own and never run
        self.runnable = sum(type(mod).forward is not nn.Module.forward for mod in mods)

    def __enter__(self) -> ModuleHooks:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        self._handles = [
            register_module_forward_pre_hook(self._fw_pre),
            register_module_forward_hook(self._fw_post, always_call=True),
        ]
        # keyword arguments reach only a module's own hooks; as the module's checkpoint holds them: before its
        # own pre-hooks (a tensor-parallel style's PrepareModuleInput, run inside the checkpoint by apply_plan),
        # but after an FSDP2 unit's (its pre-forward runs outside, and may cast them)
        self._handles += [mod.register_forward_pre_hook(self._keyword_inputs, with_kwargs=True,
                                                        prepend=not _is_fsdp_unit(mod))
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
        self.col.under_autocast = autocast_on()
        if self.col.under_autocast and not m.is_leaf:
            self.col.autocast_seen = self.col.under_autocast  # the model's own code may turn it on
        self._repeat.append(not first)
        if not first:
            self.repeats.started(m.fqn, m.is_leaf, args)
            self._later_inputs.append(dict(_activation_inputs(self.book, args)))
        if first:
            self._seen.add(m.fqn)
            self.pre_order.append(m.fqn)
            # only modules on their first (recorded) call: a repeat call is described by the first one,
            # so a child first run during its parent's second call did not run inside the recorded parent
            m.ran_inside = tuple(x.fqn for x, rep in zip(self.col.fw_stack, self._repeat) if not rep)
            m.act_before = _live_act(self.book)
            m.input_bytes = sum(self.book.nbytes(s) for s in storages_of(args))
            m.activation_inputs = _activation_inputs(self.book, args)
            grads = [t for t in tensors_in(args) if t.requires_grad]
            if grads:
                torch.autograd.graph.register_multi_grad_hook(grads, lambda _g, m=m: self._bw_post(m))
        self.col.fw_stack.append(m)

    def _fw_post(self, module: nn.Module, args: Any, output: Any) -> None:
        m = self.mods.get(module)
        if m is None or self.col.phase != ACT or not self.col.fw_stack or self.col.fw_stack[-1] is not m:
            return
        self.col.fw_stack.pop()
        self.col.under_autocast = autocast_on()
        if self._repeat.pop():
            self.repeats.finished(m.fqn, m.is_leaf, max(0, m.act_after - m.act_before - m.output_bytes), output)
            m.later_calls.append((self._later_inputs.pop(), _serials(self.book, output)))
            return
        m.done_fw = True
        self.post_order.append(m.fqn)
        self.col.timeline.forward_finished(m.fqn)
        m.act_after = _live_act(self.book)
        m.output_bytes = sum(self.book.nbytes(s) for s in storages_of(output))
        m.out_serials = _serials(self.book, output)
        outs = [t for t in tensors_in(output) if t.requires_grad]
        if outs:
            torch.autograd.graph.register_multi_grad_hook(outs, lambda _g, m=m: self._bw_pre(m), mode="any")
        if self.progress:
            self.progress("forward", len(self.post_order), self.runnable)

    def _bw_pre(self, m: Any) -> None:
        if m.bw_state != "none":
            return
        m.bw_state = "open"
        self.col.timeline.backward_started(m.fqn)
        m.temp_start = m.temp_peak = self.book.live[TEMP]
        m.act_at_peak = self.book.live[ACT]
        self.col.bw_open.append(m)

    def _bw_post(self, m: Any) -> None:
        if m.bw_state != "open":
            return
        self.close(m)

    def close(self, m: Any) -> None:
        m.bw_state = "closed"
        m.grad_total = self.book.live[GRAD]
        if m in self.col.bw_open:
            self.col.bw_open.remove(m)
        if self.progress:
            self.progress("backward", sum(x.bw_state == "closed" for x in self.mods.values()), self.runnable)


def autocast_on() -> str | None:
    """The autocast dtype in effect (``bf16``, ``fp16``, for either device type the collector emulates), or None."""
    return autocast_name("cpu") or autocast_name("cuda")


def _activation_inputs(book: StorageBook, args: Any) -> tuple[tuple[int, int], ...]:
    """(serial, bytes) of a call's inputs made in the forward."""
    return tuple((book.serial(s), book.nbytes(s)) for s in storages_of(args) if book.category(s) == ACT)


def _serials(book: StorageBook, output: Any) -> frozenset[int]:
    return frozenset(s for s in (book.serial(st) for st in storages_of(output)) if s is not None)


def _is_fsdp_unit(module: nn.Module) -> bool:
    """Whether ``fully_shard`` made ``module`` a unit (its pre-forward hook comes first among the module's own)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)

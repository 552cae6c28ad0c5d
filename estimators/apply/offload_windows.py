"""The window protocol's moments as hooks: eager calls, or ops inside a compiled graph (no graph break).

Three moments (:mod:`estimators.apply.offload`): a forward of the model starts
(a new pass), the forward of window ``j``'s end module ends (window ``j - 1``
leaves the device), and the backward of that module starts (window ``j - 1``
is fetched back). Run eagerly the hooks call the :class:`HostStore`. Traced by
dynamo (``torch.compile``) they put ops in the graph instead, so the model
compiles to one graph, the graph the stats were collected from (a graph break
at each window end made per-window graphs that keep more bytes, one
hidden-sized activation on the fidelity llama, bench/RESULTS.md):

* ``sacplan::pass_start(store)`` and ``sacplan::window_end(store, index)``,
  custom ops registered effectful (``EffectType.ORDERED``): functionalization
  threads an effect token through them (``with_effects``), so no pass drops or
  reorders them against each other, and the graph runs them where the hooks
  ran, after the end module's last op;
* an identity (:class:`_PrefetchMark`, an autograd function returning a view)
  on each output of the end module that requires grad, whose backward calls
  ``sacplan::window_fetch(grad, store, window)`` (effectful too) before the
  gradient flows on: the compiled backward runs it where the end module's
  backward starts.

The ops name their store by :attr:`HostStore.key` (an int a graph can carry).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.library import EffectType
from torch.utils._pytree import tree_map_only

from estimators.apply.offload import HostStore

__all__ = ["install_windows", "pass_start", "remove_windows", "window_end", "window_ends", "window_fetch"]

_WINDOW_HOOKS = "_sacplan_offload_hooks"  # the window hooks' handles, on the root module


@torch.library.custom_op("sacplan::pass_start", mutates_args=())
def pass_start(store: int) -> None:
    """A forward of the model starts: the store's new pass."""
    HostStore.by_key(store).start_pass()


@torch.library.custom_op("sacplan::window_end", mutates_args=())
def window_end(store: int, index: int) -> None:
    """The forward of end module ``index`` ended: window ``index - 1`` leaves the device (and is checked freed)."""
    HostStore.by_key(store).end_window(index)


@torch.library.custom_op("sacplan::window_fetch", mutates_args=())
def window_fetch(grad: torch.Tensor, store: int, window: int) -> list[torch.Tensor]:
    """The backward of window ``window + 1``'s end module starts (``grad`` arrived): fetch window ``window``.
    Returns the fetched device tensors, which the graph drops (the store holds them) but a step tracker sees
    made here: an allocation inside a kernel reaches no dispatch mode."""
    return HostStore.by_key(store).fetch_window(window)


@pass_start.register_fake
def _(store: int) -> None:
    return None


@window_end.register_fake
def _(store: int, index: int) -> None:
    return None


@window_fetch.register_fake
def _(grad: torch.Tensor, store: int, window: int) -> list[torch.Tensor]:
    return []  # how many is known at run time only; the graph reads none of them


for _op in (pass_start, window_end, window_fetch):  # kept and ordered in the graph though nothing reads them
    _op.register_effect(EffectType.ORDERED)


class _PrefetchMark(torch.autograd.Function):
    """Identity in the forward; its backward fetches a window before the gradient goes on."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, store: int, window: int) -> torch.Tensor:
        ctx.store, ctx.window = store, window
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        torch.ops.sacplan.window_fetch(grad, ctx.store, ctx.window)
        return grad, None, None


def _started(store: HostStore) -> None:
    if torch.compiler.is_compiling():
        torch.ops.sacplan.pass_start(store.key)
    else:
        store.start_pass()


def _ended(store: HostStore, index: int, out: Any) -> Any:
    if not torch.compiler.is_compiling():
        store.window_ended(index, out)
        return None
    torch.ops.sacplan.window_end(store.key, index)
    if index == 0:  # window 0's end drops nothing
        return None
    return tree_map_only(torch.Tensor, lambda t: _PrefetchMark.apply(t, store.key, index - 1)
                         if t.requires_grad else t, out)


def install_windows(model: nn.Module, store: HostStore, by_fqn: dict[str, nn.Module]) -> None:
    """Hooks for the window protocol: a new pass at the model's forward start, each end module's forward end
    (and, compiled, its backward start)."""
    hooks = [model.register_forward_pre_hook(lambda mod, args: _started(store))]
    for index, fqn in enumerate(store.end_modules):
        end = model if fqn == "" else by_fqn[fqn]
        hooks.append(end.register_forward_hook(
            lambda mod, args, out, index=index: _ended(store, index, out)))
    model.__dict__[_WINDOW_HOOKS] = hooks


def remove_windows(model: nn.Module) -> None:
    """Undo :func:`install_windows`."""
    for h in model.__dict__.pop(_WINDOW_HOOKS, []):
        h.remove()


def window_ends(doc: Any, root: str, planned: list[str], by_fqn: dict[str, nn.Module]) -> list[str]:
    """The end modules of the plan's offload windows (the model's root as ""), checked: each a module of the
    model, none strictly inside a planned module (its forward would end again in the recomputation), the last
    the root."""
    windows = doc.get("offload_windows")
    if not windows:
        raise ValueError("the plan offloads (modules[*].offload) but has no offload_windows: a plan from "
                         "`sacplan plan --offload on` lists them")
    distance = doc.get("prefetch_distance", 1)
    if distance not in (None, 1):
        raise ValueError(f"plan prefetch_distance {distance!r} is not supported: apply prefetches one window ahead "
                         f"(1)")
    ends = ["" if str(w.get("end_module", "")) in ("", root) else str(w.get("end_module")) for w in windows]
    for j, fqn in enumerate(ends):
        if fqn and fqn not in by_fqn:
            raise ValueError(f"plan offload_windows[{j}].end_module {fqn!r} is not a module of the model")
        inside = next((p for p in planned if (fqn or root).startswith(p + ".")), None)
        if inside is not None:
            raise ValueError(f"plan offload_windows[{j}].end_module {fqn!r} lies inside planned module {inside!r}: "
                             f"a window must end outside every checkpointed region")
    if ends[-1] != "":
        raise ValueError(f"plan offload_windows[-1].end_module is {ends[-1]!r}: the last window ends with the "
                         f"model's forward (\"\" or {root!r})")
    return ends

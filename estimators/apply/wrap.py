"""Apply a plan: wrap the planned modules with selective activation checkpointing.

Each planned module's ``forward``, with the module's own forward pre-hooks
(a tensor-parallel style's input redistribution), runs under ``torch.utils.checkpoint``
(non-reentrant, ``preserve_rng_state=True``) with a policy that maps the
plan's ``save`` list onto the ops the module runs
(:mod:`estimators.apply.policy`), only while the module is in training mode
and grad is enabled: in eval mode or under ``torch.no_grad()`` the module
runs as it is (there is nothing to discard, and no memory promise).

Give ``example_inputs`` and the plan is checked on one dry step before
training (:func:`estimators.check_plan`): a plan that cannot be mapped
raises :class:`PlanMismatchError` there, naming the module, the op, the
likely cause and its fix; with ``compile_backend`` the sequence
``torch.compile`` traces is recorded and aligned too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

from estimators.apply.alignment import StatsOps
from estimators.apply.buffer_guard import guarded_recompute
from estimators.apply.dry_check import check_plan
from estimators.apply.offload import HostStore, offload_decisions
from estimators.apply.offload_compile import disable_compiled_offload, enable_compiled_offload, refuse_offload_backend
from estimators.apply.offload_modes import offload_contexts
from estimators.apply.offload_windows import install_windows, remove_windows, window_ends
from estimators.apply.policy import COMPILED, PLAN_MARK, TRACED, ModulePlan, PlanMismatchError, RngReplay, aot_tracing
from estimators.apply.settings_match import match_compile_backend, match_model_settings
from estimators.common import autocast_name, module_fqns

__all__ = ["apply_plan", "remove_plan", "PlanMismatchError"]

_USABLE = ("optimal", "feasible")
_PRE_HOOKS = "_sacplan_pre_hooks"  # a planned module's own forward pre-hooks, run inside its checkpoint
log = logging.getLogger(__name__)


def apply_plan(model: nn.Module, plan: Any, *, stats: Any = None, example_inputs: Any = None,
               loss_fn: Callable[[Any], torch.Tensor] | None = None,
               compile_backend: str | None = None) -> nn.Module:
    """Checkpoint every module the plan names, saving the ops it says; returns ``model``.

    ``plan`` is the plan JSON as a dict or a :class:`planner.Plan`. ``stats``
    (a :class:`planner.Stats`, its dict, or None) gives the op names, view and
    random flags and the model settings the stats were collected with
    (``metadata.model_settings``): ``use_cache`` is switched off as training
    does, any other difference is refused. Without stats the plan's own
    ``op_names`` are used. ``example_inputs`` (and ``loss_fn``, default
    ``output.loss`` or the sum of the first float output) run
    :func:`estimators.check_plan` at once, under ``compile_backend`` too if
    given. Apply the plan before ``torch.compile``. A plan with no module
    (the step fits the budget as it is) leaves the model as it is, eager or
    compiled. Stats collected with a ``compile_backend`` want the same one
    here (:class:`PlanMismatchError` otherwise, naming both); their ops are
    the traced ones, so an eager run of such a plan fails at the first op
    the trace decomposes differently (dropout), with that cause named.
    """
    doc = plan.model_dump() if hasattr(plan, "model_dump") else plan
    if not isinstance(doc, Mapping):
        raise ValueError(f"plan must be a dict or a planner.Plan, got {type(plan).__name__}")
    status = doc.get("status", "optimal")
    if status not in _USABLE:
        raise ValueError(f"plan status is {status!r}: only {' or '.join(_USABLE)} plans can be applied")
    sdoc = stats.model_dump() if hasattr(stats, "model_dump") else stats
    hint = match_model_settings(model, None if sdoc is None else (sdoc.get("metadata") or {}))
    recorded = ((sdoc or {}).get("metadata") or {}).get("model_settings") or {}
    hint = match_compile_backend(recorded, compile_backend) or hint
    ops = _stats_ops(sdoc)
    remove_plan(model)
    by_fqn = {fqn: mod for mod, fqn in module_fqns(model).items()}
    planned = list(doc.get("modules") or [])
    fqns = [str(pm.get("fqn")) for pm in planned]
    _check_fqns(model, fqns, by_fqn)
    plans = [_module_plan(i, pm, fqns[i], ops, hint) for i, pm in enumerate(planned)]
    _set_up_offload(model, doc, plans, by_fqn, compile_backend)
    for mp in plans:
        if sdoc is not None:
            mp.autocast = (recorded.get("autocast"),)
        mp.traced_stats = "compile_backend" in recorded
        mp.seeded_random = mp.traced_stats and _tp_size(sdoc) > 1
        _wrap(by_fqn[mp.fqn], mp)
    log.info("%s", _applied_line(model, doc, fqns))
    if example_inputs is not None and plans:  # an empty plan (the step fits as it is) applies as a no-op
        check_plan(model, example_inputs, loss_fn=loss_fn, compile_backend=compile_backend)
    return model


def _set_up_offload(model: nn.Module, doc: Mapping, plans: list[ModulePlan], by_fqn: dict[str, nn.Module],
                    compile_backend: str | None) -> None:
    """A plan that offloads gets one host store for the model and the window hooks its protocol needs."""
    if all(mp.offload is None for mp in plans):
        return
    if compile_backend is not None:
        refuse_offload_backend(compile_backend)
    per_call = {str(pm.get("fqn")) for pm in doc.get("modules") or () if (pm.get("offload_calls") or 1) > 1}
    if compile_backend is not None and per_call:
        raise PlanMismatchError(f"module {min(per_call)!r} offloads per call (plan offload_calls: it is called more "
                                f"than once), which runs eagerly only; fix: apply the plan without compile_backend "
                                f"and run the model eagerly, or plan it with offload 'off'")
    root = next(fqn for fqn, mod in by_fqn.items() if mod is model)
    store = HostStore(window_ends(doc, root, [mp.fqn for mp in plans], by_fqn))
    install_windows(model, store, by_fqn)
    if compile_backend is not None:
        enable_compiled_offload(model, store)
    for mp in plans:
        mp.host_store = store
        mp.offload_per_call = mp.fqn in per_call


def _applied_line(model: nn.Module, doc: Mapping, fqns: list[str]) -> str:
    """What ``apply_plan`` wrapped, in one line: the modules, the recompute, the budget and the planned peak."""
    budget, peak, recompute = doc.get("memory_budget_gib"), doc.get("peak_bytes"), doc.get("recompute_ms")
    figures = [f"recompute {recompute:.3g} ms" if isinstance(recompute, (int, float)) else "",
               f"budget {budget:.4g} GiB" if isinstance(budget, (int, float)) else "",
               f"planned peak {peak / 2**30:.4g} GiB" if isinstance(peak, (int, float)) else "",
               f"offloading {doc['host_bytes'] / 2**30:.4g} GiB to host" if doc.get("host_bytes") else ""]
    what = (f"checkpointed {len(fqns)} modules ({', '.join(fqns[:8])}{', ...' if len(fqns) > 8 else ''})" if fqns
            else "the plan checkpoints nothing (no-op)")
    return "; ".join([f"apply_plan: {type(model).__name__}: {what}", ", ".join(f for f in figures if f)]).rstrip("; ")


def remove_plan(model: nn.Module) -> nn.Module:
    """Undo :func:`apply_plan`: every wrapped module gets its own forward back; returns ``model``."""
    remove_windows(model)
    disable_compiled_offload(model)
    for mod in model.modules():
        inner = mod.__dict__.pop("_sacplan_forward", None)
        mod.__dict__.pop(PLAN_MARK, None)
        _give_back_pre_hooks(mod, mod.__dict__.pop(_PRE_HOOKS, []))
        if inner is not None:
            mod.__dict__.pop("forward", None)
            if getattr(inner, "__self__", None) is not mod:  # an instance-level forward the user had set
                mod.forward = inner
    return model


def _check_fqns(model: nn.Module, fqns: list[str], by_fqn: dict[str, nn.Module]) -> None:
    for i, fqn in enumerate(fqns):
        if fqn not in by_fqn:
            raise ValueError(f"plan modules[{i}].fqn {fqn!r} is not a module of {type(model).__name__}")
        for other in fqns:
            if other != fqn and fqn.startswith(other + "."):
                raise ValueError(f"plan modules[{i}].fqn {fqn!r} lies inside planned module {other!r}: "
                                 f"nesting is not supported")


def _tp_size(sdoc: Mapping | None) -> int:
    """The tensor-parallel degree the stats were collected at (1: none, or no stats)."""
    sharding = ((sdoc or {}).get("metadata") or {}).get("sharding") or {}
    return int(sharding.get("tp_size") or 1)


def _stats_ops(sdoc: Mapping | None) -> dict[str, list[dict]] | None:
    if sdoc is None:
        return None
    return {m["fqn"]: m["ops"] for m in sdoc["modules"] if m.get("ops") is not None}


def _module_plan(i: int, pm: Mapping, fqn: str, ops: dict[str, list[dict]] | None, hint: str) -> ModulePlan:
    save = pm.get("save")
    if not isinstance(save, Sequence) or any(s not in (0, 1) for s in save):
        raise ValueError(f"plan modules[{i}].save must be a list of 0/1, got {save!r}")
    save = tuple(int(s) for s in save)
    if ops is not None and fqn not in ops:
        raise PlanMismatchError(f"module {fqn!r} has no op list in the stats (a leaf, or a module the collector "
                                f"left out: see their tags['modules_left_out']), so no plan for these stats "
                                f"checkpoints it")
    if ops is not None:
        mine = ops[fqn]
        names = [op["name"] for op in mine]
        view = [bool(op.get("view_like")) for op in mine]
        random = [bool(op.get("random")) for op in mine]
    elif pm.get("op_names") is not None:
        names = list(pm["op_names"])
        view, random = [_looks_view(n) for n in names], [False] * len(names)
    else:
        return ModulePlan(fqn, None, save, hint, offload=offload_decisions(i, pm, fqn, save, None, None))
    if len(names) != len(save):
        raise PlanMismatchError(f"module {fqn!r}: the plan has {len(save)} save decisions but the stats list "
                                f"{len(names)} ops")
    rand = sorted({s for s, r in zip(save, random) if r})
    if len(rand) > 1:
        first = next(k for k, r in enumerate(random) if r)
        other = next(k for k, r in enumerate(random) if r and save[k] != save[first])
        raise PlanMismatchError(f"module {fqn!r}: random op {other} ({names[other]}) has save={save[other]} but "
                                f"random op {first} has save={save[first]}: random ops must all be saved or all "
                                f"recomputed")
    return ModulePlan(fqn, StatsOps(tuple(names), save, tuple(view), tuple(random)), save, hint,
                      offload=offload_decisions(i, pm, fqn, save, names, view))


def _looks_view(name: str) -> bool:
    """A plan without stats lists names only: view-ness from the ATen schema."""
    from estimators.common import is_view_op

    packet = getattr(torch.ops.aten, name.removeprefix("aten."), None) if name.startswith("aten.") else None
    overload = getattr(packet, "default", None) if packet is not None else None
    return bool(overload is not None and is_view_op(overload))


def _check_autocast(mp: ModulePlan) -> None:
    """PlanMismatchError when autocast differs from the stats' forward (a planned call, from the first on)."""
    (wanted,) = mp.autocast
    running = autocast_name("cpu") or autocast_name("cuda")
    if running != wanted:
        raise PlanMismatchError(
            f"module {mp.fqn!r} runs under autocast {running or 'off'} but the stats were collected with autocast "
            f"{wanted or 'off'}: the casts are other ops and other bytes; fix: run forward and loss as collected "
            f"(with torch.autocast(device_type, dtype=...) for {wanted}) or collect the stats again"
            f"{' with --autocast ' + running if running else ' without --autocast'}")


def _contexts(mp: ModulePlan, compiled: bool, module: nn.Module) -> Any:
    if mp.offload is not None:
        return _offload_contexts(mp, compiled, module)
    pair = create_selective_checkpoint_contexts(mp.new_call(compiled), allow_cache_entry_mutation=True)
    if compiled and not aot_tracing():  # compile's eager backend runs checkpoint without preserve_rng_state
        return RngReplay(*pair).contexts()
    if not compiled:  # the recomputation leaves the buffers as the forward left them (BatchNorm's statistics)
        return pair[0], guarded_recompute(module, pair[1])
    return pair


def _offload_contexts(mp: ModulePlan, compiled: bool, module: nn.Module) -> Any:
    """The context pair of a call whose plan offloads: our own pair when ops run eagerly (torch's eager pair
    recomputes what is tagged for offload), torch's under AOT tracing (the joint pass moves what it tags)."""
    traced = compiled and aot_tracing()
    mode = TRACED if traced else COMPILED
    if compiled and mp.recording is None and (mode not in mp.tables or not mp.host_store.compiled):
        raise PlanMismatchError(f"module {mp.fqn!r}: the plan offloads and the model is compiled, but apply_plan ran "
                                f"without example_inputs and compile_backend (no {mode} decisions, or no offload "
                                f"pass): nothing would be offloaded; fix: apply_plan(model, plan, stats=stats, "
                                f"example_inputs=batch, compile_backend=BACKEND) or check_plan(model, batch, "
                                f"compile_backend=BACKEND) before torch.compile")
    if compiled and mp.offload_per_call:
        raise PlanMismatchError(f"module {mp.fqn!r} offloads per call (plan offload_calls: it is called more than "
                                f"once), which runs eagerly only; fix: run the model without torch.compile, or plan "
                                f"it with offload 'off'")
    if traced:
        return create_selective_checkpoint_contexts(mp.new_call(compiled), allow_cache_entry_mutation=True)
    forward_ctx, recompute_ctx = offload_contexts(mp.new_call(compiled), mp.host_store, mp.fqn, module,
                                                  mp.offload_per_call)
    if compiled:  # compile's eager backend runs checkpoint without preserve_rng_state
        return RngReplay(forward_ctx, recompute_ctx).contexts()
    return forward_ctx, guarded_recompute(module, recompute_ctx)


def _take_pre_hooks(module: nn.Module) -> list[tuple[int, Callable[..., Any], bool]]:
    """The module's own forward pre-hooks, in call order, as (id, hook, with kwargs), taken off the module.

    The collector counts what a module's own pre-hooks run as the module's ops (its module hooks are global, so
    they run first); a tensor-parallel style's input redistribution is one (``PrepareModuleInput`` on attention
    or the MLP, as torchtitan's parallelize functions put it: an all-gather of the sequence shards). The
    checkpoint must hold them too, as torchtitan's checkpoint wrapper (around the whole module call) does: a
    planned module runs them inside it. Hooks registered after the plan (``fully_shard``'s) stay outside.
    """
    hooks = module._forward_pre_hooks  # layout: allow-private (nn.Module keeps its hooks there; no public list)
    with_kwargs = module._forward_pre_hooks_with_kwargs  # layout: allow-private (as above)
    taken = [(hook_id, hook, hook_id in with_kwargs) for hook_id, hook in hooks.items()]
    hooks.clear()
    for hook_id, _, _ in taken:
        with_kwargs.pop(hook_id, None)
    return taken


def _give_back_pre_hooks(module: nn.Module, taken: list[tuple[int, Callable[..., Any], bool]]) -> None:
    """Undo :func:`_take_pre_hooks`: the hooks back on the module, before any registered since."""
    hooks = module._forward_pre_hooks  # layout: allow-private (as in _take_pre_hooks)
    for hook_id, hook, with_kwargs in reversed(taken):
        hooks[hook_id] = hook
        hooks.move_to_end(hook_id, last=False)
        if with_kwargs:
            module._forward_pre_hooks_with_kwargs[hook_id] = True  # layout: allow-private (as above)


def _run_pre_hooks(module: nn.Module, taken: list[tuple[int, Callable[..., Any], bool]], args: tuple,
                   kwargs: dict) -> tuple[tuple, dict]:
    """``args`` and ``kwargs`` through the taken pre-hooks, as ``nn.Module.__call__`` passes them: a hook's
    result (if not None) replaces the arguments, a lone value standing for the one positional argument."""
    for _, hook, with_kwargs in taken:
        if with_kwargs:
            result = hook(module, args, kwargs)
            if result is not None:
                if not (isinstance(result, tuple) and len(result) == 2):
                    raise RuntimeError(f"forward pre-hook {hook!r} with kwargs must return None or (args, kwargs), "
                                       f"got {result!r}")
                args, kwargs = result
        else:
            result = hook(module, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
    return args, kwargs


def _wrap(module: nn.Module, mp: ModulePlan) -> None:
    inner = module.forward
    module._sacplan_forward = inner  # layout: allow-private (our mark on the user's module, for remove_plan)
    module.__dict__[PLAN_MARK] = mp
    taken = _take_pre_hooks(module)
    module.__dict__[_PRE_HOOKS] = taken

    def hooked(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = _run_pre_hooks(module, taken, args, kwargs)
        return inner(*args, **kwargs)

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not (module.training and torch.is_grad_enabled()):
            return hooked(*args, **kwargs)  # nothing autograd keeps, or not training: no checkpointing
        compiled = torch.compiler.is_compiling()
        if mp.autocast is not None and not compiled:
            _check_autocast(mp)
        out = checkpoint(hooked, *args, use_reentrant=False, preserve_rng_state=True,
                         context_fn=partial(_contexts, mp, compiled, module), **kwargs)
        if not compiled and mp.recording is None and mp.last_call is not None:
            missing = mp.last_call.missing_op()
            if missing is not None:
                raise PlanMismatchError(f"module {mp.fqn!r}: ran {mp.last_call.count} ops but {missing}. Likely "
                                        f"cause: {mp.hint or 'the model is not the one the plan was made for'}")
        return out

    module.forward = forward

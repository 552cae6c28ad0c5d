"""Offloading under ``torch.compile`` (AOTAutograd, ``aot_eager``): the saved tensor crosses as a host copy.

Under AOT tracing torch's own selective-checkpoint contexts tag the graph
(``node.meta["recompute"]``); the policy tags what the plan offloads
``MUST_CPU_OFFLOAD``, which torch 2.13's partitioner would leave to its
heuristics and, with its own offload pass, would copy with ``device_put`` (an
alias on a CPU target, placed and prefetched by torch, not by the plan's
windows). Instead :func:`offload_joint_pass`, a functorch joint-graph pass,
rewrites each tagged node ``x``::

    h = sacplan.to_host(x, label)      # MUST_SAVE: the partitioner saves h, not x
    r = sacplan.from_host(h, device)   # MUST_RECOMPUTE: every use of x reads r

so the forward graph hands ``x`` to the model's :class:`HostStore` (stashed
in the current window, copied to a fresh host storage) and saves only the
host copy for the backward, and the backward graph's ``from_host`` takes the
device copy the window protocol prefetched. In the forward, ``from_host``
returns the stashed ``x`` itself (no copy). The window moments are ops in the
same graph (:mod:`estimators.apply.offload_windows`: no graph break), so
device bytes leave and come back at exactly the moments of the eager path.

Compile's ``eager`` backend needs none of this: it runs checkpoint eagerly,
so :mod:`estimators.apply.wrap` gives it our own context pair. Inductor is
refused (:data:`INDUCTOR_REFUSAL`, tried on torch 2.13 CPU, docs/apply.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch._functorch.config  # layout: allow-private (functorch's joint-pass hook: no public module)
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy

from estimators.apply.offload import HostStore
from estimators.common import backward_nodes, module_fqns

__all__ = ["INDUCTOR_REFUSAL", "OFFLOAD_COMPILE_BACKENDS", "disable_compiled_offload", "enable_compiled_offload", "offload_joint_pass",
           "refuse_offload_backend", "to_host", "from_host"]

OFFLOAD_COMPILE_BACKENDS = ("eager", "aot_eager")  # eager: compile's eager backend runs our own context pair
_OFFLOAD = (CheckpointPolicy.MUST_CPU_OFFLOAD, CheckpointPolicy.PREFER_CPU_OFFLOAD)
_JOINT_PASS = "_sacplan_joint_pass"  # on the model: the joint pass found before its offloading plan set its own


@torch.library.custom_op("sacplan::to_host", mutates_args=())
def to_host(x: torch.Tensor, label: str, module_id: int) -> torch.Tensor:
    """The running store offloads ``x`` (made by the op ``label`` names, in the module whose ``id`` is
    ``module_id``, 0 if unknown); returns the host copy (a storage of its own)."""
    store = HostStore.running()
    fqn = store.fqn_by_id.get(module_id)
    return store.host_copy(x, f"module {fqn!r}: {label}" if fqn else label)


@to_host.register_fake
def _(x: torch.Tensor, label: str, module_id: int) -> torch.Tensor:
    return torch.empty_like(x, device="cpu")


@torch.library.custom_op("sacplan::from_host", mutates_args=())
def from_host(host: torch.Tensor, device: str) -> torch.Tensor:
    """The device tensor of a host copy (the stashed one in the forward, the fetched one in the backward)."""
    return HostStore.holding(host).device_copy(host)


@from_host.register_fake
def _(host: torch.Tensor, device: str) -> torch.Tensor:
    return torch.empty_like(host, device=device)


def _fake(op: Any, *args: Any) -> Any:
    val = args[0]
    with val.fake_mode:
        return op(*args)


def _module_id(n: torch.fx.Node) -> int:
    """The ``id`` of the innermost module that ran the node, as dynamo records it (0 if it did not)."""
    stack = n.meta.get("nn_module_stack") or {}
    try:
        return int(list(stack)[-1]) if stack else 0
    except ValueError:
        return 0


def _backward_reads(g: torch.fx.Graph) -> set[torch.fx.Node]:
    """The forward nodes the backward may read: those a backward node takes, and the inputs of a forward node the
    backward may read that the partitioner may recompute (every one not saved by a tag: outside the planned
    regions the min-cut partitioner may recompute too). A node tagged for offload outside this set would be
    copied to the host and let go unread at its window's drop: the plan recomputes such an op
    (``planner.solve.offload_solve.drop_unread_offloads``), this keeps any other from copying."""
    backward = backward_nodes(g)
    read: set[torch.fx.Node] = set()
    kept = (CheckpointPolicy.MUST_SAVE, *_OFFLOAD)
    for node in reversed(g.nodes):
        if node in backward:
            read.update(a for a in node.all_input_nodes if a not in backward)
        elif node in read and node.meta.get("recompute") not in kept:
            read.update(node.all_input_nodes)
    return read


def offload_joint_pass(gm: torch.fx.GraphModule, joint_inputs: Any) -> torch.fx.GraphModule:
    """Rewrite every node tagged for offload into ``to_host`` / ``from_host`` (see the module doc)."""
    g = gm.graph
    changed = False
    read = _backward_reads(g)
    for n in list(g.nodes):
        if n.meta.get("recompute") not in _OFFLOAD:
            continue
        val = n.meta.get("val")
        n.meta["recompute"] = CheckpointPolicy.MUST_SAVE
        if not isinstance(val, torch.Tensor) or val.numel() == 0 or n not in read:
            continue  # a tuple-valued or empty node: saved as it is (frees nothing to offload); one no backward reads
        label = f"compiled node {n.name} ({n.target})"
        args = (n, label, _module_id(n))
        with g.inserting_after(n):
            h = g.call_function(torch.ops.sacplan.to_host.default, args)
        with g.inserting_after(h):
            r = g.call_function(torch.ops.sacplan.from_host.default, (h, str(val.device)))
        n.replace_all_uses_with(r, delete_user_cb=lambda user: user is not h)
        h.meta["val"] = _fake(torch.ops.sacplan.to_host.default, val, *args[1:])
        r.meta["val"] = val
        h.meta["recompute"], r.meta["recompute"] = CheckpointPolicy.MUST_SAVE, CheckpointPolicy.MUST_RECOMPUTE
        for key in ("ac_graph_id", "stack_trace", "seq_nr"):
            if key in n.meta:
                h.meta[key] = r.meta[key] = n.meta[key]
        changed = True
    if changed:
        g.lint()
        gm.recompile()
    return gm


def _chained(before: Callable | None) -> Callable:
    if before is None or before is offload_joint_pass:
        return offload_joint_pass

    def both(gm: torch.fx.GraphModule, joint_inputs: Any) -> torch.fx.GraphModule:
        return offload_joint_pass(before(gm, joint_inputs), joint_inputs)

    return both


INDUCTOR_REFUSAL = (  # what failed when tried (torch 2.13, CPU; docs/apply.md "Under torch.compile")
    "Inductor's generated forward writes in place into the buffer sacplan::from_host returns, which is the "
    "stashed offloaded tensor itself, so the window drop finds its version bumped and the host copy stale; with "
    "inplace_buffers off its wrapper frees a buffer before a fused kernel reads it, next to the effectful "
    "sacplan::window_end; and its buffers (empty_strided_cpu) and fused kernels reach no dispatch mode, so no "
    "step tracker could measure the plan")


def refuse_offload_backend(backend: str) -> None:
    """ValueError unless a plan that offloads can run under ``torch.compile(backend=backend)``."""
    if backend in OFFLOAD_COMPILE_BACKENDS:
        return
    why = INDUCTOR_REFUSAL if backend == "inductor" else "not a backend sacplan knows"
    raise ValueError(f"compile_backend={backend!r}: a plan that offloads runs eagerly or under torch.compile with "
                     f"backend {' or '.join(repr(b) for b in OFFLOAD_COMPILE_BACKENDS)} only ({why}); compile with "
                     f"backend='aot_eager', train without torch.compile, or plan with offload off")


def _config() -> Any:
    return torch._functorch.config  # layout: allow-private (functorch's joint-pass hook has no public setter)


def enable_compiled_offload(model: nn.Module, store: HostStore) -> None:
    """Set up the compiled path for ``model``'s store: :func:`offload_joint_pass` set in AOTAutograd (after any
    joint pass already set) until :func:`disable_compiled_offload`. Compilation is lazy (the first call of a
    compiled model, and every recompile), so the pass stays set while the plan is applied."""
    if _JOINT_PASS not in model.__dict__:
        before = _config().joint_custom_pass
        _config().joint_custom_pass = _chained(before)
        model.__dict__[_JOINT_PASS] = (before,)
    store.compiled = True
    store.fqn_by_id = {id(mod): fqn for mod, fqn in module_fqns(model).items()}


def disable_compiled_offload(model: nn.Module) -> None:
    """Undo :func:`enable_compiled_offload`: the joint pass found before is set again."""
    if _JOINT_PASS in model.__dict__:
        _config().joint_custom_pass = model.__dict__.pop(_JOINT_PASS)[0]

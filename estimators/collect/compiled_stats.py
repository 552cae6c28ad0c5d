"""The stats made to describe the compiled step, from what :mod:`estimators.collect.compile_probe` saw.

Under ``aot_eager``: per module, what the partitioner saves fewer than eager autograd
(:func:`credit_compiled_saves`), the tensors the compiled graph makes once for several modules, held by their
maker (:func:`hold_shared_tensors`), and what a later taker of one keeps before it when checkpointed alone
(:func:`hold_for_takers`).
"""

from __future__ import annotations

from typing import Any

from estimators.collect.compile_probe import CompiledProbe

__all__ = ["mark_compiled", "credit_compiled_saves", "hold_shared_tensors", "hold_for_takers",
           "free_ops_compile_never_runs"]


def _fqn_of(path: str, root: str, fqns: set[str]) -> str:
    """The stats fqn of a module ``path`` relative to the root: the innermost module of the stats on it."""
    parts = [p for p in path.split(".") if p]
    while parts and ".".join([root, *parts]) not in fqns:
        parts.pop()
    return ".".join([root, *parts])


def credit_compiled_saves(stats: Any, fewer_saved: dict[str, int]) -> None:
    """Make the stats describe what the compiled step keeps: per module, ``fewer_saved`` bytes (eager saves less
    the partitioner's, by the innermost module of the node that made them) come off ``act_saved_bytes`` of that
    module and of every module around it, and off the live activations of every moment while its forward has
    ended and its backward not begun (forward and backward moments whose key passes its fw_post_order position,
    as a checkpointing discard is counted). A module a plan checkpoints discards from the compiled figure."""
    order = stats.fw_post_order
    fqns = set(order)
    root = next(m.fqn for m in stats.modules if m.parent is None)
    per_fqn: dict[str, int] = {}
    for path, nbytes in fewer_saved.items():
        fqn = _fqn_of(path, root, fqns)
        fqn = fqn if fqn in fqns else root
        per_fqn[fqn] = per_fqn.get(fqn, 0) + nbytes
    inside: dict[str, int] = {}
    for fqn, nbytes in per_fqn.items():
        up: str | None = fqn
        while up is not None:
            inside[up] = inside.get(up, 0) + nbytes
            up = stats.module(up).parent
    for m in stats.modules:
        m.act_saved_bytes = max(0, m.act_saved_bytes - inside.get(m.fqn, 0))
    position = {fqn: k for k, fqn in enumerate(order)}
    ended = [0] * (len(order) + 1)  # by key: bytes of the modules at positions below it
    for fqn, nbytes in per_fqn.items():
        ended[position[fqn] + 1] += nbytes
    for k in range(1, len(ended)):
        ended[k] += ended[k - 1]
    for t in stats.timeline or ():
        if t.phase in ("forward", "backward"):
            t.activation_bytes = max(0, t.activation_bytes - ended[min(t.key, len(order))])


def hold_shared_tensors(stats: Any, shared: list[tuple[str, tuple[str, ...], int]]) -> None:
    """Count each tensor the compiled step makes once for several modules (``shared``: the module path making it,
    the paths of the modules whose own op it replaces, its bytes) as held by the module that makes it and every
    module around that one short of one around them all: checkpointed, such a module keeps the tensor under
    compile when a later checkpointed region uses it (the partitioner saves a region's tensors a later region
    uses), which no op of its eager save list says. Counted always (it bounds the real step from above by at most
    those bytes when no later region uses it); it offsets the module's discard as its held inputs do."""
    fqns, root, number = _fqns_root_number(stats)
    for path, others, nbytes in shared:
        around = {_fqn_of(p, root, fqns) for p in others}
        _hold_up(stats, fqns, _fqn_of(path, root, fqns), around, number, nbytes)
        number += 1


def hold_for_takers(stats: Any, kept_for: list[tuple[str, str, int]]) -> None:
    """Count what the modules before a taker of a shared tensor keep when the taker is checkpointed
    (``kept_for``: the module path making the tensor, the taker's, the bytes :func:`_kept_outside` found) as
    held by the taker and every module around it short of one around the maker: checkpointed, it keeps them
    until its backward remakes the tensor (the partitioner saves its ingredients, not the tensor). Takers
    keeping the same bytes for one maker share a tensor number, so several checkpointed ones count it once."""
    fqns, root, number = _fqns_root_number(stats)
    numbers: dict[tuple[str, int], int] = {}
    for maker, taker, nbytes in kept_for:
        made_in = _fqn_of(maker, root, fqns)
        up = _fqn_of(taker, root, fqns)
        if nbytes <= 0 or up == made_in:
            continue
        if (maker, nbytes) not in numbers:
            numbers[(maker, nbytes)] = number
            number += 1
        _hold_up(stats, fqns, up, {made_in}, numbers[(maker, nbytes)], nbytes)


def _fqns_root_number(stats: Any) -> tuple[set[str], str, int]:
    """The stats' module fqns, the root's, and the first tensor number no held input uses yet."""
    fqns = set(stats.fw_post_order)
    root = next(m.fqn for m in stats.modules if m.parent is None)
    return fqns, root, 1 + max((k for m in stats.modules for k, _ in m.held_inputs or ()), default=0)


def _hold_up(stats: Any, fqns: set[str], up: str | None, inner: set[str], number: int, nbytes: int) -> None:
    """Count tensor ``number`` (``nbytes``) as held by module ``up`` and every module around it, up to (not
    including) the first one around all of ``inner``."""
    while up is not None and up in fqns and not all(o == up or o.startswith(up + ".") for o in inner):
        m = stats.module(up)
        m.held_input_bytes += nbytes
        if m.held_inputs is not None:
            m.held_inputs = [*m.held_inputs, (number, nbytes)]
        up = m.parent


def free_ops_compile_never_runs(stats: Any, graph_ops: set[str]) -> None:
    """Make each op of the stats that no compiled graph runs at all (``graph_ops``: the names of the ops the
    joint graphs run) cost nothing saved or offloaded: the collected step runs model code that takes another
    path under dynamo (Hugging Face's attention builds SDPA's causal mask with ``ones`` and ``tril`` there; the
    compiled graph makes the mask in the root from other ops), so the compiled step never keeps it. Only
    out-of-place ATen ops (not views, in-place or random ones, not communication), whose names functionalization
    does not change; nothing when no graph was seen."""
    if not graph_ops:
        return
    for m in stats.modules:
        for op in m.ops or ():
            if op.output_bytes and op.name.startswith("aten.") and op.name not in graph_ops and not (
                    op.view_like or op.random or op.must_save or op.inplace_parent is not None):
                op.output_bytes = 0


def mark_compiled(stats: Any, backend: str, probe: CompiledProbe | None = None) -> None:
    """Record the compile backend in the stats' model settings, and save every random op: a traced
    recomputation cannot replay the RNG on the CPU, so apply saves random ops under compile. Under
    ``aot_eager``, the stats then count what its partitioner saves (``probe``: :func:`credit_compiled_saves`);
    inductor's partitioner runs with settings of its own, not followed here."""
    stats.metadata.model_settings["compile_backend"] = backend
    for m in stats.modules:
        m.force_store_random = m.force_store_random or any(op.random for op in m.ops or ())
    if backend == "aot_eager" and probe is not None:
        credit_compiled_saves(stats, probe.fewer_saved)
        hold_shared_tensors(stats, probe.shared)
        hold_for_takers(stats, probe.kept_for)
        free_ops_compile_never_runs(stats, probe.graph_ops)

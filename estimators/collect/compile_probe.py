"""The compiled step run once on the fake model, to learn what its graphs do that the eager step cannot show.

``torch.compile`` runs on fake tensors: dynamo traces the fake model, AOTAutograd partitions each graph as
``aot_eager`` does (``inductor`` partitions alike; its kernels only change what runs inside), and the graphs
run on the fake tensors. What the probe reads: the gradients of zeros the compiled backward is handed for
graph outputs that get none, and, under ``aot_eager``, what its partitioner saves for the backward per module
(the stats are made to say so in :mod:`estimators.collect.compiled_stats`). Where dynamo breaks the graph (Hugging Face's GPT-2 logs a warning before its
loss: the loss is a graph of its own, whose backward sends the logits their real gradient) there are none, so
it is the compiled run, not the model's outputs, that says which outputs get them.
"""

from __future__ import annotations

import operator
import re
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from estimators.common import backward_nodes, is_view_op, storages_of, tensors_in

__all__ = ["zero_gradient_outputs", "CompiledProbe", "eager_saved_by_module", "saved_by_module",
           "shared_across_modules"]

_ZERO_MAKERS = {torch.ops.aten.zeros.default, torch.ops.aten.zeros_like.default, torch.ops.aten.new_zeros.default}


class _ZeroTangents(TorchDispatchMode):
    """Tensors of zeros made in the backward outside the compiled backward graphs: AOTAutograd's tangents."""

    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()
        self.in_graph = 0
        self.made: list[tuple[tuple[int, ...], torch.dtype]] = []
        self.compiled_saved: dict[str, int] = {}  # per module fqn (relative), what the partitioned forward saves
        self.shared: list[tuple[str, tuple[str, ...], int]] = []  # per tensor one forward op makes for several modules
        # per module taking such a tensor: (the module making it, the taker, bytes: :func:`_kept_outside`)
        self.kept_for: list[tuple[str, str, int]] = []
        self.graph_ops: set[str] = set()  # the names of the ops the compiled forward graphs run

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True  # else dynamo runs every frame eagerly while the mode is on

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _ZERO_MAKERS and not self.in_graph and isinstance(out, torch.Tensor):
            self.made.append((tuple(out.shape), out.dtype))
        return out

    def backward_compiler(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        from torch._functorch.aot_autograd import make_boxed_func

        def run(*args: Any) -> Any:
            self.in_graph += 1
            try:
                return gm(*args)
            finally:
                self.in_graph -= 1

        return make_boxed_func(run)


    def partition(self, joint: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
        """``aot_eager``'s partition (the min-cut one), what it saves recorded per module in ``compiled_saved``."""
        from torch._functorch.partitioners import min_cut_rematerialization_partition

        shared = shared_across_modules(joint)  # before the partition, which merges them
        self.graph_ops.update(str(n.target.overloadpacket) for n in joint.graph.nodes
                              if n.op == "call_function" and hasattr(n.target, "overloadpacket"))
        makers = {taker: maker for maker, others, _ in reversed(shared) for taker in others}
        untagged = _tagged_copy(joint, "") if makers else None  # the partition changes the joint graph
        fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
        saved = saved_by_module(fw, bw)
        for path, nbytes in saved.items():
            fqn = _relative_fqn(path)
            self.compiled_saved[fqn] = self.compiled_saved.get(fqn, 0) + nbytes
        self.shared += shared
        for taker in sorted(makers):  # one copy at a time: a large model's joint graph is large
            tagged = _tagged_copy(untagged, taker)
            self.kept_for.append((makers[taker], taker, _kept_outside(taker, saved, saved_by_module(
                *min_cut_rematerialization_partition(tagged, joint_inputs, **kwargs)))))
        return fw, bw


def _storage_key(st: torch.UntypedStorage) -> int:
    return st._cdata  # layout: allow-private (a fake storage's only identity, as StorageBook's)


def _held(tree: Any) -> list[torch.UntypedStorage]:
    """The storages holding the data of the strided tensors in ``tree``: a DTensor's are its local shard's (the
    wrapper's own storage holds nothing; the compiled graph, desugared, saves the shard)."""
    return [st for t in tensors_in(tree) if t.layout == torch.strided for st in storages_of(t)]


class _Creators(TorchDispatchMode):
    """Which module made each storage, while the eager forward runs: the innermost one running."""

    def __init__(self, running: list[str]) -> None:
        super().__init__()
        self.running = running
        self.made: dict[int, tuple[str, int, Any]] = {}  # storage -> (module fqn, bytes, the storage)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        taken = {_storage_key(st) for st in _held((args, kwargs))}
        for st in _held(out):  # a view's or in-place op's output is not made here: a parameter's transpose
            if _storage_key(st) not in taken:
                self.made.setdefault(_storage_key(st), (self.running[-1], st.nbytes(), st))
        return out


def eager_saved_by_module(model: nn.Module, run_step: Any) -> dict[str, int]:
    """Bytes the eager forward and loss save for the backward, per innermost module (fqn relative to ``model``,
    ``""`` the root) that made each storage; storages made before the step (parameters, inputs) do not count."""
    running = [""]
    handles = []

    def leave(*_: Any) -> None:  # a hook returning something would replace the module's output
        running.pop()

    for fqn, mod in model.named_modules():
        handles.append(mod.register_forward_pre_hook(lambda m, a, fqn=fqn: running.append(fqn)))
        handles.append(mod.register_forward_hook(leave, always_call=True))
    creators = _Creators(running)
    saved: dict[int, str] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        for st in _held(t):
            if (key := _storage_key(st)) in creators.made:
                saved.setdefault(key, creators.made[key][0])
        return t

    try:
        with creators, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = run_step(model)
        del loss
    finally:
        for h in handles:
            h.remove()
    out: dict[str, int] = {}
    for key, fqn in saved.items():
        out[fqn] = out.get(fqn, 0) + creators.made[key][1]
    return out


def _relative_fqn(path: str) -> str:
    """A dynamo module path (``L['self'].model.layers[0].mlp``, ``L['args'][0].model...``) as an fqn relative
    to the compiled module."""
    path = re.sub(r"^L\[[^\]]*\](\[\d+\])?\.?", "", path)
    return re.sub(r"\[(\d+)\]", r".\1", path).replace("_modules['", "").replace("']", "")


def _module_path(node: torch.fx.Node) -> str:
    """The innermost module path of a graph node, as an fqn relative to the compiled module (``""``: none)."""
    stack = list((node.meta.get("nn_module_stack") or {}).values())
    return _relative_fqn(re.sub(r"\.forward\.__closure__\[?\.?\d+\]?\.cell_contents\.__self__", "",
                                stack[-1][0])) if stack else ""


def shared_across_modules(joint: torch.fx.GraphModule) -> list[tuple[str, tuple[str, ...], int]]:
    """Forward ops the compiled graph runs once for several modules, as (module path, paths of the modules
    repeating it, output bytes).

    An op the joint graph repeats (the same op on the same arguments) in another module, as each decoder layer
    turns the same mask into the same additive one: AOTAutograd merges the repeats into the first (common-
    subexpression elimination), and a checkpointed region whose tensor a later region takes keeps it (the
    partitioner saves it, ``cleanup_recompute_tags``), which the eager step never shares. Random ops are never
    merged.
    """
    first: dict[Any, torch.fx.Node] = {}
    same: dict[torch.fx.Node, torch.fx.Node] = {}  # a repeat -> the first
    out: dict[torch.fx.Node, set[str]] = {}  # the first -> the modules of its repeats
    backward = backward_nodes(joint.graph)
    for node in joint.graph.nodes:
        if node in backward:
            continue
        target = node.target
        if node.op != "call_function" or getattr(target, "overloadpacket", None) is None or is_view_op(target) \
                or torch.Tag.nondeterministic_seeded in target.tags:
            continue
        args = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: same.get(a, a))
        try:
            key = (target, _hashable(args))
            hash(key)
        except TypeError:
            continue
        if key not in first:
            first[key] = node
            continue
        same[node] = made = first[key]
        val = made.meta.get("val")
        if isinstance(val, torch.Tensor) and _module_path(made) != _module_path(node):
            out.setdefault(made, set()).add(_module_path(node))
    return [(_module_path(node), tuple(sorted(paths)), node.meta["val"].untyped_storage().nbytes())
            for node, paths in out.items()]


def _within(path: str, fqn: str) -> bool:
    return path == fqn or path.startswith(fqn + ".")


def _tagged_copy(joint: torch.fx.GraphModule, fqn: str) -> torch.fx.GraphModule:
    """A copy of the joint graph with the forward of module ``fqn`` (a relative path; ``""``: none) tagged as a
    checkpointed region saving nothing but its random ops, as a plan's policy tags it under compile (random ops
    and their outputs left untagged: the partitioner never recomputes them)."""
    from torch.utils.checkpoint import CheckpointPolicy

    graph = torch.fx.Graph()
    graph._codegen = joint.graph._codegen  # layout: allow-private (the joint's pytree signature)
    graph.output(graph.graph_copy(joint.graph, {}))  # a node's meta is copied: the joint's stays untagged
    backward = backward_nodes(graph)
    for node in graph.nodes:
        if node not in backward and fqn and node.op == "call_function" and _within(_module_path(node), fqn) and not _random(node):
            node.meta["recompute"] = CheckpointPolicy.PREFER_RECOMPUTE
            node.meta["ac_graph_id"] = 1
    return torch.fx.GraphModule(joint, graph)


def _random(node: torch.fx.Node) -> bool:
    if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())


def _kept_outside(fqn: str, unplanned: dict[str, int], planned: dict[str, int]) -> int:
    """The bytes the forward saves outside module ``fqn`` beyond the unplanned graph's when ``fqn`` alone is
    checkpointed (``saved_by_module`` of both partitions): what its recompute takes from the modules before it
    instead of a tensor the compiled graph makes once for several modules (a causal mask's indices, kept where
    the mask is made, when a later layer remakes the mask in its backward)."""
    return sum(max(0, nbytes - unplanned.get(path, 0)) for path, nbytes in planned.items()
               if not _within(_relative_fqn(path), fqn))


def _hashable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def _base(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose storage ``node`` shares: through view ops (their first argument aliases the output)."""
    while node.op == "call_function" and node.args and isinstance(node.args[0], torch.fx.Node):
        schema = getattr(node.target, "_schema", None)
        if schema is None or not schema.arguments or schema.arguments[0].alias_info is None:
            break
        node = node.args[0]
    return node


def saved_by_module(fw: torch.fx.GraphModule, bw: torch.fx.GraphModule) -> dict[str, int]:
    """Bytes the forward graph ``fw`` saves for the backward graph ``bw``, per innermost module path of the node
    that made each storage (``nn_module_stack``; ``""`` outside every module). Inputs and parameters are not
    activations, and a saved tensor the forward also returns (the logits) is live as an output anyway: neither
    counts, as eager stats count neither in a module's saved bytes."""
    saved = [n.name for n in bw.graph.nodes if n.op == "placeholder" and not n.name.startswith("tangents")]
    nodes = {n.name: n for n in fw.graph.nodes}
    outputs = [a for a in next(n for n in fw.graph.nodes if n.op == "output").args[0]]
    returned = {_base(a) for a in outputs[:len(outputs) - len(saved)] if isinstance(a, torch.fx.Node)}
    out: dict[str, int] = {}
    seen: set[torch.fx.Node] = set()
    for name in saved:
        base = _base(nodes[name])
        val = base.meta.get("val")
        if base.op == "placeholder" or base in returned or base in seen or not isinstance(val, torch.Tensor):
            continue
        seen.add(base)
        stack = list((base.meta.get("nn_module_stack") or {}).values())
        path = stack[-1][0] if stack else ""
        out[path] = out.get(path, 0) + val.untyped_storage().nbytes()
    return out


class CompiledProbe:
    """What one compiled step on the fake model showed (see :func:`zero_gradient_outputs`)."""

    def __init__(self, zero_gradients: list[tuple[tuple[int, ...], torch.dtype]], compiled_saved: dict[str, int],
                 shared: list[tuple[str, tuple[str, ...], int]] | None = None,
                 kept_for: list[tuple[str, str, int]] | None = None, graph_ops: set[str] | None = None):
        self.zero_gradients = zero_gradients
        self.compiled_saved = compiled_saved  # per fqn relative to the compiled module: what its forward saves
        self.shared = shared or []  # forward ops run once for several modules (:func:`shared_across_modules`)
        self.kept_for = kept_for or []  # what a taker of one, checkpointed alone, has kept before it
        self.graph_ops = graph_ops or set()  # the names of the ops the compiled graphs run
        self.fewer_saved: dict[str, int] = {}  # the same, what the eager forward saves more (:meth:`count_eager`)

    def count_eager(self, model: nn.Module, eager_step: Any) -> None:
        """Fill ``fewer_saved``: ``eager_step(model)`` runs the forward and loss as the stats' step does (the
        batch's path; under :func:`traced_ops`) and returns the loss."""
        eager = eager_saved_by_module(model, eager_step)
        for fqn, nbytes in self.compiled_saved.items():
            eager[fqn] = eager.get(fqn, 0) - nbytes
        self.fewer_saved = eager


def zero_gradient_outputs(model: nn.Module, run_step: Any, backend: str) -> CompiledProbe:
    """Shape and dtype of each gradient of zeros the compiled backward is handed, from one compiled step, and
    what its partitioner saves fewer than eager per module.

    ``run_step(model)`` runs forward and loss on the fake inputs and returns
    the loss. The step's gradients are dropped and dynamo reset afterwards.
    """
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop

    del backend  # inductor's AOT partitioning hands out the same tangents; aot_eager's needs no C++ compiler
    probe = _ZeroTangents()
    # aot_eager's own settings (torch/_dynamo/backends/debugging.py), its partition recorded
    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=boxed_nop, bw_compiler=probe.backward_compiler,
                                                         partition_fn=probe.partition,
                                                         keep_inference_input_mutations=True))
    torch._dynamo.reset()  # layout: allow-private (no graph of an earlier compile may answer)
    try:
        loss = run_step(compiled)
        with probe:
            loss.backward()
        del loss
    except Exception as exc:  # dynamo's own errors are long and name no option
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise RuntimeError(f"compile_backend: torch.compile could not run the step on the fake model "
                           f"({type(exc).__name__}: {first}); collect without --compile-backend") from exc
    finally:
        for p in model.parameters():
            p.grad = None
        torch._dynamo.reset()  # layout: allow-private (the probe's graphs hold the fake model)
    return CompiledProbe(probe.made, probe.compiled_saved, probe.shared, probe.kept_for, probe.graph_ops)

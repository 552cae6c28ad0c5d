"""ATen ops as selective activation checkpointing sees them: names, views, in-place and random ops."""

from __future__ import annotations

from typing import Any

import torch

try:  # the ops the selective-checkpoint dispatch modes pass through without asking the policy
    from torch.utils.checkpoint import SAC_IGNORED_OPS
except ImportError:  # older torch: the same set, spelled out
    SAC_IGNORED_OPS = {torch.ops.aten.detach.default, torch.ops.prim.device.default}

__all__ = ["SAC_IGNORED_OPS", "backward_nodes", "op_name", "is_view_op", "is_inplace_op", "is_random_op",
           "written_tensors"]


def op_name(func: Any) -> str:
    """The name an op gets in the stats: its overload packet, e.g. ``aten.mm``."""
    return str(func.overloadpacket)


def _schema(func: Any) -> Any:
    return func._schema  # layout: allow-private (an OpOverload's schema has no public accessor)


def is_view_op(func: Any) -> bool:
    """View-like (views and in-place views): the SAC conventions recompute them."""
    return bool(func.is_view) or torch.Tag.inplace_view in func.tags


def is_inplace_op(func: Any) -> bool:
    """Mutates its first argument (tagged in-place, or a trailing-underscore name that is no view)."""
    return torch.Tag.inplace in func.tags or (_schema(func).name.endswith("_") and not func.is_view)


def is_random_op(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether the ATen op ``func`` called with ``args`` and ``kwargs`` draws random numbers.

    Seeded nondeterministic ops do; attention kernels only with a nonzero
    ``dropout_p``. The collector marks these ops in the stats and
    :func:`estimators.apply_plan` requires them all saved or all recomputed.
    """
    for i, a in enumerate(_schema(func).arguments):
        if a.name == "dropout_p":  # attention kernels: random only with dropout
            p = kwargs.get("dropout_p", args[i] if i < len(args) else a.default_value)
            return bool(p)
    return torch.Tag.nondeterministic_seeded in func.tags


def written_tensors(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors the ATen op ``func`` writes (in place or through ``out=``), in schema order."""
    from torch.utils._pytree import tree_flatten

    out = []
    for i, a in enumerate(_schema(func).arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            x = kwargs[a.name] if a.name in kwargs else args[i] if i < len(args) else None
            out += [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]
    return out


def backward_nodes(graph: Any) -> set[Any]:
    """The nodes of a joint fx graph (AOTAutograd's forward and backward in one) that depend on the tangents: its
    backward."""
    backward: set[Any] = set()
    for node in graph.nodes:
        if (node.op == "placeholder" and node.name.startswith("tangents")) or any(
                a in backward for a in node.all_input_nodes):
            backward.add(node)
    return backward

"""The module orders of a stats document: checks that they describe one depth-first forward pass."""

from __future__ import annotations

from collections.abc import Container
from typing import Any

__all__ = ["check_contiguous", "check_order", "check_sibling_order", "innermost_prefix_module"]


def check_sibling_order(s: Any, pre: dict[str, int], post: dict[str, int]) -> None:
    """Both orders visit a module's children in the same order, as one depth-first walk does."""
    children: dict[str, list[str]] = {}
    for fqn in s.fw_pre_order:
        parent = s.module(fqn).parent
        if parent is not None:
            children.setdefault(parent, []).append(fqn)
    for parent, kids in children.items():
        for a, b in zip(kids, kids[1:]):
            if post[a] > post[b]:
                raise ValueError(f"fw_pre_order runs {a!r} before its sibling {b!r} (fw_pre_order[{pre[a]}] and "
                                 f"[{pre[b]}]) but fw_post_order has {b!r} first (fw_post_order[{post[b]}] and "
                                 f"[{post[a]}]); one forward pass runs the children of {parent!r} in one order")


def innermost_prefix_module(fqn: str, index: Container[str]) -> str | None:
    """The longest proper dotted prefix of ``fqn`` that is a module."""
    cut = fqn.rfind(".")
    while cut > 0:
        if fqn[:cut] in index:
            return fqn[:cut]
        cut = fqn.rfind(".", 0, cut)
    return None


def check_contiguous(s: Any, pre: dict[str, int], post: dict[str, int]) -> None:
    """Each module's subtree is one unbroken run of both orders, as in a depth-first walk.

    The memory model and the nesting rule read "finished before" and "inside"
    off these orders; a module of another branch inside a subtree's run would
    make them disagree with the parent links.
    """
    size = {m.fqn: 1 for m in s.modules}
    for fqn in s.fw_post_order:  # children before parents
        parent = s.module(fqn).parent
        if parent is not None:
            size[parent] += size[fqn]
    for field, order, pos, first in (("fw_pre_order", s.fw_pre_order, pre, lambda f: pre[f]),
                                     ("fw_post_order", s.fw_post_order, post, lambda f: post[f] - size[f] + 1)):
        for fqn in order:
            lo = first(fqn)
            for k in range(lo, lo + size[fqn]):
                other = order[k]
                if other != fqn and not other.startswith(fqn + "."):
                    raise ValueError(f"{field}[{k}] {other!r} is not a submodule of {fqn!r} but lies inside "
                                     f"the run of its submodules, {field}[{lo}:{lo + size[fqn]}]")


def check_order(field: str, order: list[str], index: dict[str, int]) -> None:
    if len(order) != len(index):
        raise ValueError(f"{field} has {len(order)} entries but there are {len(index)} modules")
    seen: set[str] = set()
    for k, fqn in enumerate(order):
        if fqn not in index:
            raise ValueError(f"{field}[{k}] {fqn!r} is not a module fqn")
        if fqn in seen:
            raise ValueError(f"{field}[{k}] {fqn!r} appears twice")
        seen.add(fqn)

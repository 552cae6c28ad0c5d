"""The names the stats give a model's modules: fully qualified, rooted at the model's class name."""

from __future__ import annotations

from torch import nn

__all__ = ["module_fqns"]


def module_fqns(model: nn.Module, *, root: str | None = None) -> dict[nn.Module, str]:
    """fqn of every submodule, rooted at the model's class name (``Transformer.layers.0``) or ``root``."""
    root = root or type(model).__name__
    out: dict[nn.Module, str] = {}
    for name, mod in model.named_modules(remove_duplicate=True):
        out[mod] = f"{root}.{name}" if name else root
    return out

"""Tensor parallel applied to a model: the user's function, or the model's Hugging Face plan.

In order of preference (issue 29): the user's own function, called as
torchtitan calls its ``parallelize`` functions, with the model and the TP
mesh; else the model's Hugging Face plan (``model.tp_plan``, or the config's
``base_model_tp_plan`` under the base model's prefix with the class's
``_tp_plan``), its style names mapped onto ``parallelize_module``'s styles
here: there are no weights to load, so HF's own loading-time machinery is not
needed. Every style is made with ``src_data_rank=None``: each rank keeps its
own copy's shard and nothing is broadcast (the collector's ranks are fake;
real ranks build the same weights from one seed).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

__all__ = ["HF_TP_STYLES", "hf_tp_plan", "load_function", "parallelize_tp"]

# HF's style names (transformers.integrations.tensor_parallel) and what each is as a parallelize_module style.
HF_TP_STYLES = ("colwise", "rowwise", "colwise_rep", "colwise_gather_output", "rowwise_rep", "embedding_rowwise",
                "sequence_parallel")


def load_function(spec: str, option: str) -> Callable[..., Any]:
    """The function named by ``path/to/file.py:fn``; ValueError naming ``option`` otherwise."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise ValueError(f"{option} must look like path/to/file.py:function, got {spec!r}")
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"{option} file {path!r} does not exist")
    mod_spec = importlib.util.spec_from_file_location(f"sacplan_user_{file.stem}", file)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{option} {spec!r}: {path} has no function {name!r}")
    return fn


def hf_tp_plan(model: nn.Module) -> dict[str, str]:
    """The model's Hugging Face TP plan, fqn patterns to style names (``*``: one module name); {} if none."""
    plan = getattr(model, "tp_plan", None)
    if isinstance(plan, dict) and plan:
        return dict(plan)
    config = getattr(model, "config", None)
    base = dict(getattr(config, "base_model_tp_plan", None) or {})
    prefix = getattr(model, "base_model_prefix", "")
    if base and prefix and hasattr(model, prefix):
        base = {f"{prefix}.{k}": v for k, v in base.items()}
    return {**base, **dict(getattr(type(model), "_tp_plan", None) or {})}


def _style(name: str, key: str) -> Any:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    made = {
        "colwise": lambda: ColwiseParallel(),
        "rowwise": lambda: RowwiseParallel(),
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
        "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
        "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),
        "sequence_parallel": lambda: SequenceParallel(),
    }.get(name)
    if made is None:
        raise ValueError(f"tp plan entry {key!r}: style {name!r} is not one sacplan maps onto parallelize_module "
                         f"(it maps {', '.join(HF_TP_STYLES)}): give --parallelize file.py:fn instead")
    style = made()
    style.src_data_rank = None  # each rank keeps its own copy's shard: nothing broadcast
    return style


def _expand(plan: dict[str, str], model: nn.Module) -> dict[str, Any]:
    """fqn -> style for every module a plan pattern names (in the model's module order)."""
    patterns = [(re.compile("^" + re.escape(k).replace(r"\*", r"[^.]+") + "$"), k, v) for k, v in plan.items()]
    out: dict[str, Any] = {}
    for fqn, _ in model.named_modules():
        for rx, key, name in patterns:
            if rx.match(fqn):
                out[fqn] = _style(name, key)
                break
    return out


def parallelize_tp(model: nn.Module, tp_mesh: Any, *, parallelize: str | None = None) -> str:
    """Apply tensor parallel to ``model`` over ``tp_mesh``, in place; returns what was applied (for the stats).

    ``parallelize``: the user's ``file.py:fn``, called as ``fn(model, tp_mesh)``;
    None: the model's HF plan; neither there: ValueError saying which to give.
    """
    if parallelize is not None:
        fn = load_function(parallelize, "--parallelize")
        fn(model, tp_mesh)
        return parallelize
    plan = hf_tp_plan(model)
    if not plan:
        raise ValueError(f"{type(model).__name__} has no Hugging Face tensor-parallel plan (no tp_plan nor "
                         f"config.base_model_tp_plan): give --parallelize file.py:fn, a function called with "
                         f"(model, tp_mesh) that applies parallelize_module as your training does")
    from torch.distributed.tensor.parallel import parallelize_module

    styles = _expand(plan, model)
    if not styles:
        raise ValueError(f"{type(model).__name__}'s tensor-parallel plan names no module of the model "
                         f"({', '.join(sorted(plan))[:300]}): give --parallelize file.py:fn")
    parallelize_module(model, tp_mesh, styles)
    return "hf:tp_plan"

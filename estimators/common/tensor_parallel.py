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

Sequence parallel with the HF plan (HF's decoder plans have no entries for
it) is derived here from the plan, Megatron's way as torchtitan applies it:
the residual stream between blocks is a DTensor sharded on the sequence
(``Shard(1)``); the input embedding's output is cut to its sequence shard;
every norm outside the attention and MLP blocks runs on its shard
(``SequenceParallel``); each block whose projections are column-wise gathers
its input to the whole sequence once, on entry; each row-wise projection
reduce-scatters onto the sequence shard (``output_layouts=Shard(1)``) instead
of all-reducing; the head's column-wise layer gathers its input from the
shards.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

__all__ = ["HF_TP_STYLES", "hf_tp_plan", "load_function", "parallelize_tp", "sequence_parallel_styles"]

# HF's style names (transformers.integrations.tensor_parallel) and what each is as a parallelize_module style.
HF_TP_STYLES = ("colwise", "rowwise", "colwise_rep", "colwise_gather_output", "rowwise_rep", "embedding_rowwise",
                "sequence_parallel")


def load_function(spec: str, option: str, what: str = "function") -> Callable[..., Any]:
    """The function named by ``path/to/file.py:fn``; ValueError naming ``option`` (and ``what`` the function is,
    in the expected form) otherwise."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise ValueError(f"{option} must look like path/to/file.py:{what}, got {spec!r}")
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


def _expand(plan: dict[str, str], model: nn.Module) -> dict[str, str]:
    """fqn -> the plan's style name for every module a plan pattern names (in the model's module order)."""
    patterns = [(re.compile("^" + re.escape(k).replace(r"\*", r"[^.]+") + "$"), v) for k, v in plan.items()]
    out: dict[str, str] = {}
    for fqn, _ in model.named_modules():
        for rx, name in patterns:
            if rx.match(fqn):
                out[fqn] = name
                break
    return out


def parallelize_tp(model: nn.Module, tp_mesh: Any, *, parallelize: str | None = None,
                   sequence_parallel: bool = False) -> str:
    """Apply tensor parallel to ``model`` over ``tp_mesh``, in place; returns what was applied (for the stats).

    ``parallelize``: the user's ``file.py:fn``, called as ``fn(model, tp_mesh)``
    (it applies sequence parallel itself, if any); None: the model's HF plan,
    with sequence parallel derived from it when ``sequence_parallel``
    (:func:`sequence_parallel_styles`); neither there: ValueError saying which to give.
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

    if sequence_parallel:
        styles, blocks = sequence_parallel_styles(model, plan)
        for fqn in blocks:
            _gather_sequence_on_entry(model.get_submodule(fqn))
        parallelize_module(model, tp_mesh, styles)
        return "hf:tp_plan+sequence_parallel"
    styles = {fqn: _style(name, fqn) for fqn, name in _expand(plan, model).items()}
    if not styles:
        raise ValueError(f"{type(model).__name__}'s tensor-parallel plan names no module of the model "
                         f"({', '.join(sorted(plan))[:300]}): give --parallelize file.py:fn")
    parallelize_module(model, tp_mesh, styles)
    return "hf:tp_plan"


def sequence_parallel_styles(model: nn.Module, plan: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
    """(fqn -> style, the blocks that gather their input on entry) for the HF ``plan`` with sequence parallel.

    The blocks are the parents of the plan's column-wise projections (a
    decoder layer's attention and MLP) and the head (``colwise_gather_output``); the norms are the modules named
    ``*Norm`` outside those blocks (a layer's two norms and the final one; a
    norm inside attention, as Qwen3's on heads, is not on the sequence).
    ValueError for a plan this does not derive (say to give ``--parallelize``).
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleOutput, RowwiseParallel,
                                                   SequenceParallel)

    made: dict[str, Any] = {}
    blocks: list[str] = []
    for fqn, name in _expand(plan, model).items():
        if name == "colwise":
            made[fqn] = ColwiseParallel()
            parent = fqn.rpartition(".")[0]
            if parent and parent not in blocks:
                blocks.append(parent)
        elif name == "rowwise":
            made[fqn] = RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
        elif name in ("colwise_rep", "colwise_gather_output"):  # the head: its input gathered in its forward
            made[fqn] = ColwiseParallel(output_layouts=Replicate())
            blocks.append(fqn)
        elif name == "embedding_rowwise":
            made[fqn] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False)
        else:
            raise ValueError(f"tp plan entry {fqn!r}: style {name!r} is not derived for sequence parallel here: "
                             f"give --parallelize file.py:fn that applies SequenceParallel as your training does")
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    fqn_of = {m: f for f, m in model.named_modules()}
    if embed is None or embed not in fqn_of:
        raise ValueError(f"{type(model).__name__} has no input embedding (get_input_embeddings) to cut onto "
                         f"sequence shards: give --parallelize file.py:fn")
    if fqn_of[embed] not in made:
        made[fqn_of[embed]] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1),
                                                  use_local_output=False)
    norms = [f for f, m in model.named_modules() if type(m).__name__.endswith("Norm")
             and not any(f.startswith(b + ".") for b in blocks)]
    if not blocks or not norms:
        raise ValueError(f"{type(model).__name__}: no {'norm' if blocks else 'column-wise block'} found to put on "
                         f"sequence shards: give --parallelize file.py:fn")
    for f in norms:
        made[f] = SequenceParallel()
    for style in made.values():
        style.src_data_rank = None  # each rank keeps its own copy's shard: nothing broadcast
    return made, blocks


def _gather_sequence_on_entry(block: nn.Module) -> None:
    """``block``'s hidden states (its first argument, or ``hidden_states=``), sequence shards, gathered to the
    whole sequence once on entry (a DTensor, ``Replicate``): its column-wise projections share the one copy.

    The gather runs inside the block's ``forward`` (the instance's, wrapping the class's), not in a forward
    pre-hook: ``apply_plan`` checkpoints a module's ``forward``, so the gather is an op of the block for the
    collector and for the plan alike (a pre-hook would run outside the checkpoint but inside the collector's
    module), and a must-save collective there is saved, not gathered again in the recompute.
    """
    from torch.distributed.tensor import DTensor, Replicate

    inner = block.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        x = args[0] if args else kwargs.get("hidden_states")
        if not isinstance(x, DTensor):
            raise TypeError(f"{type(block).__name__}: sequence parallel expects its hidden states as a DTensor "
                            f"on sequence shards, got {type(x).__name__}")
        x = x.redistribute(placements=[Replicate()])
        if args:
            return inner(x, *args[1:], **kwargs)
        return inner(**{**kwargs, "hidden_states": x})

    block.forward = forward

"""The parts of a training step every job runs alike: calling the model, its default loss, the optimizer."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from estimators.common.storage_book import tensors_in

__all__ = ["OPTIMIZER_NAMES", "call_model", "default_loss", "make_optimizer", "optimizer_class"]


def default_loss(output: Any) -> torch.Tensor:
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits.sum()
    ts = [t for t in tensors_in(output) if t.is_floating_point()]
    if not ts:
        raise ValueError("the model output has no floating-point tensor to take a loss from; pass loss_fn")
    return ts[0].sum()


def call_model(model: nn.Module, inputs: Any) -> Any:
    """Call the model on example inputs: a dict is keyword arguments, a tuple/list positional."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


# The built-in optimizer names and the class each means (torch's defaults: any argument goes in optimizer_kwargs).
OPTIMIZER_NAMES = {"adamw": "torch.optim.AdamW", "adam": "torch.optim.Adam", "sgd": "torch.optim.SGD"}


def optimizer_class(spec: str) -> type:
    """The optimizer class ``spec`` names: a built-in name (``OPTIMIZER_NAMES``) or a dotted class path
    (``torch.optim.Adagrad``, ``transformers.optimization.Adafactor``); ValueError naming what is wrong."""
    path = OPTIMIZER_NAMES.get(spec, spec)
    module, _, name = path.rpartition(".")
    if not module or not name:
        raise ValueError(f"optimizer {spec!r} is neither one of {', '.join([*OPTIMIZER_NAMES, 'none'])} nor a "
                         f"dotted class path such as torch.optim.Adagrad")
    try:
        cls = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise ValueError(f"optimizer {spec!r}: cannot import module {module!r} ({exc})") from None
    except AttributeError:
        raise ValueError(f"optimizer {spec!r}: module {module!r} has no attribute {name!r}") from None
    if not isinstance(cls, type) or not issubclass(cls, torch.optim.Optimizer):
        raise ValueError(f"optimizer {spec!r} is not a torch.optim.Optimizer subclass (got {cls!r})")
    return cls


def make_optimizer(name: str | Callable[[list[nn.Parameter]], torch.optim.Optimizer], params: list[nn.Parameter], *,
                   foreach: bool = False, kwargs: dict[str, Any] | None = None) -> torch.optim.Optimizer | None:
    """The step's optimizer: ``name`` a built-in name, ``none``, a dotted class path, or ``optimizer_fn(params)``.

    ``kwargs`` go to the class (torch's defaults otherwise: ``sgd`` has no
    momentum unless given). ``foreach``: the multi-tensor implementation
    (PyTorch's default on CUDA), passed when the class takes it and
    ``kwargs`` do not set it (nor ``fused``). Their temporaries differ: the
    for-loop step holds one parameter's worth at a time, the foreach step one
    of every parameter at once.
    """
    if name == "none" or not params:
        return None
    if callable(name) and not isinstance(name, type):
        return name(params)
    cls = optimizer_class(name) if isinstance(name, str) else name
    args = dict(kwargs or {})
    if "foreach" in inspect.signature(cls.__init__).parameters and not {"foreach", "fused"} & set(args):
        args["foreach"] = foreach
    if cls is torch.optim.SGD and "lr" not in args:
        args["lr"] = 1e-3  # torch's default since 2.5; older releases require it
    try:
        return cls(params, **args)
    except TypeError as exc:
        raise ValueError(f"optimizer_kwargs {args!r} do not fit {cls.__name__}: {exc}") from None

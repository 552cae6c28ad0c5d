"""The parts of a training step every job runs alike: calling the model, its default loss, the optimizer."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from estimators.common.storage_book import tensors_in

__all__ = ["call_model", "default_loss", "make_optimizer"]


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


def make_optimizer(name: str, params: list[nn.Parameter], *, foreach: bool = False) -> torch.optim.Optimizer | None:
    """The step's optimizer; ``foreach``: the multi-tensor implementation (PyTorch's default on CUDA).

    Its temporaries differ: the for-loop step holds one parameter's worth at a
    time, the foreach step one of every parameter at once.
    """
    if name == "none" or not params:
        return None
    if name == "adamw":
        return torch.optim.AdamW(params, foreach=foreach)
    if name == "adam":
        return torch.optim.Adam(params, foreach=foreach)
    return torch.optim.SGD(params, lr=0.01, momentum=0.9, foreach=foreach)

"""The fake training step's parts: fake parameters and inputs, the loss, the optimizer."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_map

from estimators.tracking import StorageBook, storages_of, tensors_in

__all__ = ["fakeify", "fake_inputs", "default_loss", "call_model", "make_optimizer", "optimizer_bytes"]


def fakeify(model: nn.Module, fake: FakeTensorMode, device: torch.device, dtype: torch.dtype | None):
    """Swap parameters and buffers for fake tensors; return what restores the originals."""
    memo: dict[int, torch.Tensor] = {}
    saved: list[tuple[dict, str, Any]] = []

    def convert(t: torch.Tensor, is_param: bool) -> torch.Tensor:
        if id(t) in memo:
            return memo[id(t)]
        want = dtype if (dtype is not None and t.is_floating_point()) else t.dtype
        with fake:
            f = torch.empty_strided(t.shape, t.stride(), dtype=want, device=device)
        if is_param:
            f = nn.Parameter(f, requires_grad=t.requires_grad)
        memo[id(t)] = f
        return f

    for mod in model.modules():
        # Swapped in the module's own tables: setattr would re-register them and run registration hooks.
        tables = ((mod._parameters, True), (mod._buffers, False))  # layout: allow-private (swap, not register)
        for table, is_param in tables:
            for name, t in list(table.items()):
                if t is not None:
                    saved.append((table, name, t))
                    table[name] = convert(t, is_param)

    def restore() -> None:
        for table, name, t in saved:
            table[name] = t

    return restore


def fake_inputs(inputs: Any, fake: FakeTensorMode, device: torch.device, dtype: torch.dtype | None) -> Any:
    """Fake tensors like the inputs; a tensor given twice (``input_ids`` as ``labels``) is one fake tensor."""
    memo: dict[int, torch.Tensor] = {}

    def conv(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        if id(x) not in memo:
            want = dtype if (dtype is not None and x.is_floating_point()) else x.dtype
            with fake:
                f = torch.empty_strided(x.shape, x.stride(), dtype=want, device=device)
            memo[id(x)] = f.requires_grad_(x.requires_grad)
        return memo[id(x)]

    return tree_map(conv, inputs)


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


def optimizer_bytes(opt: torch.optim.Optimizer | None, book: StorageBook) -> dict[int, int]:
    out: dict[int, int] = {}
    if opt is None:
        return out
    for p, state in opt.state.items():
        out[id(p)] = sum(book.nbytes(s) for s in storages_of(list(state.values())))
    return out

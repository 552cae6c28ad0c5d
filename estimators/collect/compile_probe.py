"""The compiled step run once on the fake model, to learn what its graphs do that the eager step cannot show.

``torch.compile`` runs on fake tensors: dynamo traces the fake model, AOTAutograd partitions each graph as
``aot_eager`` does (``inductor`` partitions alike; its kernels only change what runs inside), and the graphs
run on the fake tensors. What the probe reads: the gradients of zeros the compiled backward is handed for
graph outputs that get none. Where dynamo breaks the graph (Hugging Face's GPT-2 logs a warning before its
loss: the loss is a graph of its own, whose backward sends the logits their real gradient) there are none, so
it is the compiled run, not the model's outputs, that says which outputs get them.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["mark_compiled", "zero_gradient_outputs"]

_ZERO_MAKERS = {torch.ops.aten.zeros.default, torch.ops.aten.zeros_like.default, torch.ops.aten.new_zeros.default}


class _ZeroTangents(TorchDispatchMode):
    """Tensors of zeros made in the backward outside the compiled backward graphs: AOTAutograd's tangents."""

    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()
        self.in_graph = 0
        self.made: list[tuple[tuple[int, ...], torch.dtype]] = []

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


def zero_gradient_outputs(model: nn.Module, run_step: Any, backend: str) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """Shape and dtype of each gradient of zeros the compiled backward is handed, from one compiled step.

    ``run_step(model)`` runs forward and loss on the fake inputs and returns
    the loss. The step's gradients are dropped and dynamo reset afterwards.
    """
    from torch._dynamo.backends.debugging import aot_eager

    del backend  # inductor's AOT partitioning hands out the same tangents; aot_eager's needs no C++ compiler
    probe = _ZeroTangents()
    compiled = torch.compile(model, backend=functools.partial(aot_eager, bw_compiler=probe.backward_compiler))
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
    return probe.made


def mark_compiled(stats: Any, backend: str) -> None:
    """Record the compile backend in the stats' model settings, and save every random op: a traced
    recomputation cannot replay the RNG on the CPU, so apply saves random ops under compile."""
    stats.metadata.model_settings["compile_backend"] = backend
    for m in stats.modules:
        m.force_store_random = m.force_store_random or any(op.random for op in m.ops or ())

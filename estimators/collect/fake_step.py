"""The fake training step's parts: fake parameters, inputs and loss captures, the forward, the optimizer's bytes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode, is_fake
from torch.utils._pytree import tree_flatten, tree_map

from estimators.collect.emulation import flex_attention_error
from estimators.collect.input_values import InputValues, attach
from estimators.collect.models import hf_fake_as_real
from estimators.collect.moe import one_hot_as_on_device
from estimators.common import StorageBook, call_model, default_loss, storages_of, tensors_in

__all__ = ["fakeify", "FakeConverter", "fake_loss_fn", "unconverted_tensor_error", "eager_loss", "forward_and_loss",
           "optimizer_bytes", "COMPILE_BACKENDS", "traced_ops", "with_zero_gradients"]

# The torch.compile backends a step can be collected under (``eager``: dynamo's graph run eagerly, as the eager step).
COMPILE_BACKENDS = ("aot_eager", "inductor")


class FakeConverter:
    """Real or meta tensors to fake tensors on the collection device: one fake per tensor, whatever path reaches it."""

    def __init__(self, fake: FakeTensorMode, device: torch.device, dtype: torch.dtype | None):
        self.fake, self.device, self.dtype = fake, device, dtype
        self.memo: dict[int, torch.Tensor] = {}

    def tensor(self, x: torch.Tensor, *, keep_value: bool = False) -> torch.Tensor:
        """The fake of ``x``; with ``keep_value``, a real ``x`` (not meta) lends it its values (a copy)."""
        if is_fake(x):
            return x
        if id(x) not in self.memo:
            want = self.dtype if (self.dtype is not None and x.is_floating_point()) else x.dtype
            with self.fake:
                f = torch.empty_strided(x.shape, x.stride(), dtype=want, device=self.device)
            self.memo[id(x)] = f.requires_grad_(x.requires_grad)
            if keep_value and x.device.type != "meta":
                attach(f, x.detach().to("cpu", want, copy=True), from_batch=True)
        return self.memo[id(x)]

    def tree(self, tree: Any, *, keep_values: bool = False) -> Any:
        """``tree`` with its tensors made fake; ``keep_values``: the batch's values kept (see ``input_values``)."""
        return tree_map(lambda x: self.tensor(x, keep_value=keep_values) if isinstance(x, torch.Tensor) else x, tree)


def fakeify(module: nn.Module, convert: FakeConverter):
    """Swap parameters and buffers for fake tensors; return what restores the originals."""
    saved: list[tuple[dict, str, Any]] = []

    def fake_of(t: torch.Tensor, is_param: bool) -> torch.Tensor:
        if id(t) not in convert.memo and is_param:
            convert.memo[id(t)] = nn.Parameter(convert.tensor(t).detach(), requires_grad=t.requires_grad)
        return convert.tensor(t)

    for mod in module.modules():
        # Swapped in the module's own tables: setattr would re-register them and run registration hooks.
        tables = ((mod._parameters, True), (mod._buffers, False))  # layout: allow-private (swap, not register)
        for table, is_param in tables:
            for name, t in list(table.items()):
                if t is not None and not is_fake(t):  # a module met twice (the model in loss_fn) is swapped once
                    saved.append((table, name, t))
                    table[name] = fake_of(t, is_param)

    def restore() -> None:
        for table, name, t in saved:
            table[name] = t

    return restore


def fake_loss_fn(loss_fn: Callable[[Any], torch.Tensor] | None, convert: FakeConverter):
    """``loss_fn`` with the tensors it captures made fake (closure cells, ``functools.partial`` arguments).

    Returns the function to call and what restores the originals. A loss
    ``nn.Module`` (``CrossEntropyLoss(weight=...)``) keeps its tensors as
    buffers: they are swapped like the model's.
    """
    if loss_fn is None:
        return None, lambda: None
    if isinstance(loss_fn, nn.Module):
        return loss_fn, fakeify(loss_fn, convert)
    if isinstance(loss_fn, functools.partial):
        inner, restore = fake_loss_fn(loss_fn.func, convert)
        return functools.partial(inner, *convert.tree(loss_fn.args, keep_values=True),
                                 **convert.tree(loss_fn.keywords, keep_values=True)), restore
    cells = [c for c in (getattr(loss_fn, "__closure__", None) or ()) if _holds_tensors(c)]
    saved = [(c, c.cell_contents) for c in cells]
    for c in cells:
        c.cell_contents = convert.tree(c.cell_contents, keep_values=True)  # labels: loss code may read them
    modules = [fakeify(c.cell_contents, convert) for c in (getattr(loss_fn, "__closure__", None) or ())
               if isinstance(_contents(c), nn.Module)]  # a captured loss module: its buffers

    def restore() -> None:
        for c, value in saved:
            c.cell_contents = value
        for undo in modules:
            undo()

    return loss_fn, restore


def _contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _holds_tensors(cell: Any) -> bool:
    return any(isinstance(x, torch.Tensor) for x in tree_flatten(_contents(cell))[0])


def unconverted_tensor_error(exc: BaseException, model: nn.Module, loss_fn: Any) -> ValueError | None:
    """A clear error for fake mode's "convert all Tensors to FakeTensors", naming the tensors it may be; else None."""
    if "convert all Tensors to FakeTensors" not in str(exc):
        return None
    suspects = [f"model attribute {name or type(model).__name__}.{attr} (neither a parameter nor a buffer)"
                for name, mod in model.named_modules() for attr, v in vars(mod).items()
                if isinstance(v, torch.Tensor) and not isinstance(v, nn.Parameter)]
    code = getattr(loss_fn, "__code__", None)
    if code is not None:
        suspects += [f"loss_fn's global {n!r}" for n in code.co_names
                     if isinstance(getattr(loss_fn, "__globals__", {}).get(n), torch.Tensor)]
    found = str(exc).rpartition("Found in ")[2].strip()
    where = "; ".join(suspects) if suspects else "a tensor held outside the model's parameters and buffers"
    return ValueError(
        f"the step used a real tensor the fake collection cannot see: {where} (in {found[:300]}). sacplan makes "
        f"fake the model's parameters and buffers, the inputs the factory returns and the tensors loss_fn "
        f"captures in its closure: return the tensor in the inputs, capture it in loss_fn's closure, or "
        f"register it as a buffer (module.register_buffer(name, tensor, persistent=False))")


def eager_loss(model: nn.Module, fake_in: Any, fake_loss: Any, loss_fn: Any) -> torch.Tensor:
    """The loss of an eager forward on the fake inputs, down the batch's path as the step's (the compile probe's)."""
    with (values := InputValues()).activated(), hf_fake_as_real(model, values), one_hot_as_on_device():
        return forward_and_loss(model, fake_in, fake_loss, loss_fn)[1]


def forward_and_loss(model: nn.Module, fake_in: Any, fake_loss: Any, loss_fn: Any) -> tuple[Any, torch.Tensor]:
    """The model's output on the fake inputs and the loss (``fake_loss``: ``loss_fn`` with fake captures)."""
    try:
        output = call_model(model, fake_in)
        return output, (fake_loss or default_loss)(output)
    except AssertionError as exc:  # fake mode's way of saying a real tensor came in
        clear = unconverted_tensor_error(exc, model, loss_fn)
        if clear is None:
            raise
        raise clear from None
    except NotImplementedError as exc:  # FlexAttention: refused on the CPU, its op not recorded
        clear = flex_attention_error(exc)
        if clear is None:
            raise
        raise clear from exc


def traced_ops() -> Any:
    """A context under which composite ops decompose as AOTAutograd traces them (the Python dispatcher).

    AOTAutograd traces with the Python dispatcher on, so a composite op with a Python decomposition runs that:
    ``aten.dropout`` (``F.dropout``, and SDPA's math path on the CPU) becomes one ``native_dropout`` keeping a
    bool mask, where eager ATen runs ``empty_like``, ``bernoulli_``, ``div_``, ``mul`` and keeps a float one.
    Run under it, the fake step's ops and saved tensors are the compiled graph's there.
    """
    from torch._dispatch.python import enable_python_dispatcher

    return enable_python_dispatcher()


class _ZeroGradients(torch.autograd.Function):
    """The gradients of zeros a compiled backward is handed, made where it makes them: at the backward's start.

    The compiled backward is one graph taking a gradient ("tangent") for every differentiable output. An output
    the loss does not use (a Hugging Face model's ``logits`` next to the ``loss`` it computed from them in the
    same graph) gets none, and AOTAutograd materializes one of zeros before the graph runs; it lives until the
    graph adds it to the gradient reaching that value from the loss (for the logits: the whole batch x sequence
    x vocabulary). Eager autograd never makes it. Put between the loss and ``backward``, this function's
    backward runs first and sends a gradient of zeros to each such output of the model: it waits in autograd's
    buffer of that output until the loss's gradient arrives and is added to it, as in the graph. A zero gradient
    no model output matches (a value dynamo passes across a graph break) is made there too and held in
    ``unmatched`` to the end of the backward (at least as long as the compiled one).
    """

    @staticmethod
    def forward(ctx: Any, loss: torch.Tensor, unmatched: list, shapes: tuple, *outputs: torch.Tensor) -> torch.Tensor:
        ctx.unmatched, ctx.shapes = unmatched, shapes
        ctx.outputs = [(o.shape, o.dtype, o.device) for o in outputs]
        return loss.view_as(loss)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        ctx.unmatched.extend(torch.zeros(shape, dtype=dtype, device=grad.device) for shape, dtype in ctx.shapes)
        return (grad, None, None, *(torch.zeros(s, dtype=d, device=dev) for s, d, dev in ctx.outputs))


def with_zero_gradients(loss: torch.Tensor, output: Any, zero_gradients: list[tuple[tuple[int, ...], torch.dtype]],
                        unmatched: list) -> torch.Tensor:
    """``loss`` whose backward first makes the compiled backward's gradients of zeros (:class:`_ZeroGradients`)."""
    left = list(zero_gradients)
    matched = []
    for x in tensors_in(output):
        key = (tuple(x.shape), x.dtype)
        if x.requires_grad and x is not loss and key in left:
            left.remove(key)
            matched.append(x)
    return _ZeroGradients.apply(loss, unmatched, tuple(left), *matched)


def optimizer_bytes(opt: torch.optim.Optimizer | None, book: StorageBook) -> dict[int, int]:
    out: dict[int, int] = {}
    if opt is None:
        return out
    for p, state in opt.state.items():
        out[id(p)] = sum(book.nbytes(s) for s in storages_of(list(state.values())))
    return out

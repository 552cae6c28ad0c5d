"""Mixture-of-experts models under fake tensors: the routing assumption and the kernels fake mode lacks.

A fake tensor has a shape but no values, and MoE layers read values: which
experts a token goes to decides how many rows each expert's matmuls get
(``nonzero``/``where`` in eager experts, ``histc``/``cumsum`` offsets for
``grouped_mm``) and which loop iterations run (``if expert_idx == ...``).
The collector therefore *assumes* the routing, and says which in the stats:

* ``balanced`` (default): every expert gets its share, tokens x top-k /
  experts (token ``t``'s ``j``-th choice is expert ``(t * k + j) mod E``);
* ``capacity:C``: expert 0 gets ``ceil(C x`` its share ``)`` token choices (at
  most one per token), the others share the rest evenly; ``C = 1`` is balanced;
* ``worst``: expert 0 gets every token (leaving one choice to each other
  expert), the others share the rest evenly.

How: the indices ``aten.topk`` returns under fake tensors get values (a
small real tensor with the assumed routing), which
:class:`~estimators.collect.input_values.InputValues` follows as it follows
the batch's: any op whose tensor arguments all have values runs on them too,
so the routing's integer tensors (one-hot masks, ``nonzero``, sorted expert
ids) carry values; a data-dependent op (``nonzero``, ``_local_scalar_dense``)
over them returns a fake tensor shaped like the real answer, or the real
scalar. Only routing tensors get values here; activations stay fake.

``aten._grouped_mm``'s fake kernel checks the CUDA kernel's bf16-only rule,
while the CPU kernel (and Hugging Face's default experts on CPU) runs any
float dtype; the fake kernel here gives the output shape for every dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from estimators.collect.input_values import attach
from estimators.common import experts_implementation

__all__ = ["MoeRouting", "parse_moe_routing", "RoutingMode", "one_hot_as_on_device", "TopKRecorder"]

ROUTING_KINDS = ("balanced", "capacity", "worst")
aten = torch.ops.aten
_GROUPED_MM = aten._grouped_mm.default  # layout: allow-private (ATen's own name for the op)
_SHADOW_LIMIT = 1 << 22  # elements: routing tensors are tokens x top-k (x experts) at most


@dataclass(frozen=True)
class MoeRouting:
    """How tokens are assumed to spread over experts under fake tensors (see the module docstring)."""

    kind: str = "balanced"
    capacity_factor: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in ROUTING_KINDS:
            raise ValueError(f"moe_routing must be one of {', '.join(ROUTING_KINDS)}, got {self.kind!r}")
        if self.kind == "capacity" and not (self.capacity_factor is not None and self.capacity_factor >= 1):
            raise ValueError(f"moe_capacity_factor must be a number >= 1 with moe_routing 'capacity', "
                             f"got {self.capacity_factor!r}")
        if self.kind != "capacity" and self.capacity_factor is not None:
            raise ValueError(f"moe_capacity_factor is only for moe_routing 'capacity', got {self.capacity_factor!r} "
                             f"with {self.kind!r}")

    def settings(self) -> dict[str, Any]:
        """The stats' ``model_settings`` entries that say which routing was assumed."""
        out: dict[str, Any] = {"moe_routing": self.kind}
        if self.capacity_factor is not None:
            out["moe_capacity_factor"] = self.capacity_factor
        return out

    def top_load(self, tokens: int, top_k: int, experts: int) -> int:
        """Token choices expert 0 gets out of ``tokens x top_k`` (at most one per token).

        Every other expert keeps at least one choice where there are enough,
        so the same experts run (the same loop iterations) as in a balanced step.
        """
        share = math.ceil(tokens * top_k / experts)
        if self.kind == "balanced":
            return share
        wanted = tokens if self.kind == "worst" else math.ceil(self.capacity_factor * tokens * top_k / experts)
        return max(share, min(wanted, tokens, tokens * top_k - (experts - 1)))

    def expert_indices(self, tokens: int, top_k: int, experts: int) -> torch.Tensor:
        """(tokens, top_k) expert ids, distinct per token, spread as the assumption says."""
        if not 1 <= top_k <= experts:
            raise ValueError(f"top-k {top_k} must be between 1 and the number of experts {experts}")
        if self.kind == "balanced" or top_k == experts:
            t = torch.arange(tokens).unsqueeze(1) * top_k + torch.arange(top_k)
            return t % experts
        loaded = self.top_load(tokens, top_k, experts)
        rest = torch.arange(tokens * top_k) % (experts - 1) + 1  # the other experts, round robin
        out = torch.empty(tokens, top_k, dtype=torch.long)
        out[:loaded, 0] = 0
        out[:loaded, 1:] = rest[: loaded * (top_k - 1)].view(loaded, top_k - 1)
        out[loaded:] = rest[loaded * (top_k - 1): loaded * (top_k - 1) + (tokens - loaded) * top_k].view(-1, top_k)
        return out


def parse_moe_routing(text: str) -> MoeRouting:
    """``balanced``, ``capacity:C`` (C >= 1) or ``worst``, as ``--moe-routing`` takes it."""
    kind, sep, factor = str(text).partition(":")
    if kind == "capacity":
        try:
            value = float(factor)
        except ValueError:
            raise ValueError(f"--moe-routing capacity needs a factor, e.g. capacity:1.25, got {text!r}") from None
        if not value >= 1:
            raise ValueError(f"--moe-routing capacity factor must be >= 1, got {text!r}")
        return MoeRouting("capacity", value)
    if sep or kind not in ROUTING_KINDS:
        raise ValueError(f"--moe-routing must be balanced, capacity:C (C >= 1) or worst, got {text!r}")
    return MoeRouting(kind)


def _grouped_mm_shape(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None) -> list[int]:
    # 2-D operands are jagged along the offsets; a 3-D one lists the groups (experts).
    if a.dim() == 2 and b.dim() == 2:  # weight gradients: one (K, N) block per group
        return [offs.size(0), a.size(0), b.size(1)]
    if a.dim() == 2:  # tokens (M, K) x experts (G, K, N)
        return [a.size(0), b.size(-1)]
    if b.dim() == 2:
        return [a.size(1), b.size(1)]
    return [a.size(0), a.size(1), b.size(-1)]


class RoutingMode(TorchDispatchMode):
    """Above the batch's values: the assumed routing as the values of topk's indices; fp32 ``grouped_mm``."""

    def __init__(self, routing: MoeRouting):
        super().__init__()
        self.routing = routing
        self.routers_seen = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _GROUPED_MM and args[0].dtype != torch.bfloat16:
            return self._grouped_mm(*args, **kwargs)
        out = func(*args, **kwargs)
        if func is aten.topk.default:
            self._shadow_topk(args, kwargs, out)
        return out

    def settings(self, model: torch.nn.Module) -> dict[str, Any]:
        """``model_settings`` entries: the experts implementation, and the routing if the model routed tokens."""
        out: dict[str, Any] = {}
        implementation = experts_implementation(model)
        if implementation is not None:
            out["experts_implementation"] = implementation
        if self.routers_seen:
            out.update(self.routing.settings())
        return out

    def _grouped_mm(self, a, b, offs=None, bias=None, out_dtype=None):
        if a.dtype != b.dtype or not a.is_floating_point():
            raise RuntimeError(f"aten._grouped_mm: operands must share a float dtype, got {a.dtype} and {b.dtype}")
        return torch.empty(_grouped_mm_shape(a, b, offs), dtype=out_dtype or a.dtype, device=a.device)

    def _shadow_topk(self, args: tuple, kwargs: dict, out: Any) -> None:
        x, k = args[0], args[1]
        dim = kwargs.get("dim", args[2] if len(args) > 2 else -1)
        if dim not in (-1, x.dim() - 1) or x.dim() == 0 or x.numel() > _SHADOW_LIMIT:
            return
        experts, tokens = x.size(-1), x.numel() // max(1, x.size(-1))
        with _disable_current_modes():
            indices = self.routing.expert_indices(tokens, k, experts).view(out[1].shape)
        attach(out[1], indices, from_batch=False)
        self.routers_seen += 1


# Devices whose one_hot kernel checks the class range on the host (aminmax, then two reads);
# CUDA, MPS, XLA and PrivateUse1 leave it to a device assert in the scatter.
_ONE_HOT_HOST_CHECK = ("cpu",)


def one_hot_as_on_device() -> Any:
    """A context under which ``F.one_hot`` on fake tensors runs the ops the real kernel runs.

    On a fake (or traced) tensor PyTorch's ``one_hot`` compares with an
    ``arange`` (it cannot read the values); on a real CPU tensor it checks the
    class range (``aminmax`` and two reads), then scatters into zeros. A plan
    matches ops by position, so the collector must see the real sequence;
    the routing's values (:class:`RoutingMode`) answer the reads.
    """
    from unittest import mock

    from torch._subclasses.fake_tensor import is_fake

    original = torch.nn.functional.one_hot

    def one_hot(tensor: torch.Tensor, num_classes: int = -1) -> torch.Tensor:
        if not is_fake(tensor) or tensor.numel() == 0:
            return original(tensor, num_classes)
        if tensor.device.type in _ONE_HOT_HOST_CHECK:
            low, high = (int(x) for x in torch.aminmax(tensor))
            if low < 0 or (num_classes != -1 and high >= num_classes):
                raise RuntimeError(f"one_hot: class values must lie in [0, {num_classes}), got {low}..{high}")
        elif num_classes == -1:
            high = int(tensor.max())
        classes = high + 1 if num_classes == -1 else num_classes
        out = torch.zeros(*tensor.shape, classes, dtype=torch.long, device=tensor.device)
        return out.scatter_(-1, tensor.unsqueeze(-1), 1)

    return mock.patch.object(torch.nn.functional, "one_hot", one_hot)


class TopKRecorder(TorchDispatchMode):
    """On real tensors: the indices of every ``aten.topk`` (the routers' choices), forward and recompute alike."""

    def __init__(self) -> None:
        super().__init__()
        self.indices: list[torch.Tensor] = []
        self.choices_of: list[int] = []  # how many it chose among (the number of experts)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is aten.topk.default:
            self.indices.append(out[1].detach().clone())
            self.choices_of.append(args[0].shape[-1])
        return out

    def busiest_over_share(self) -> list[float]:
        """Per top-k: the busiest expert's token choices over the balanced share (tokens x top-k / experts)."""
        return [float(torch.bincount(idx.flatten(), minlength=n).max()) * n / idx.numel()
                for idx, n in zip(self.indices, self.choices_of)]

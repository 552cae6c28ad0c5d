"""Target emulation: make a CPU collection see the kernels a CUDA target runs.

On a CPU, ``scaled_dot_product_attention`` with dropout falls back to the math
path, which materializes the (batch, heads, seq, seq) attention matrix and
saves it for backward. A CUDA target runs flash or memory-efficient attention,
which save only the output and a logsumexp. Under FakeTensorMode the CUDA
attention ops run fine on CPU fake tensors (they have meta kernels), so while
collecting for a CUDA target we call them directly.

Emulated choices, following PyTorch's CUDA priority order (flash, then
memory-efficient, then math):

* flash attention (``aten._scaled_dot_product_flash_attention``): fp16/bf16,
  no ``attn_mask``, head dim <= 256, equal head counts or grouped-query
  attention with ``enable_gqa=True`` (flash handles it natively);
* memory-efficient attention (``aten._scaled_dot_product_efficient_attention``):
  any other case with equal head counts (fp32 included, masks as additive
  bias; a boolean mask is converted to a 0/-inf bias as CUDA does);
* everything else (grouped-query attention that flash cannot take) is left
  to PyTorch's own dispatch: the math path.

cuDNN attention (picked first on some H100 builds) is not emulated; its saved
tensors match flash attention's.

FlexAttention (``torch.nn.attention.flex_attention``, torchtitan's default for
its language models) is not emulated: on a CPU, PyTorch refuses its backward
(there is no CPU kernel for it), and on any device the collector does not yet
record its higher-order op (``flex_attention``, whose fused kernel saves q, k,
v, the output and the logsumexp). :func:`flex_attention_error` turns either
refusal into an error that says so and what to do.

Dropout is emulated too: on a CPU, ``F.dropout`` builds a float mask
(``empty_like``, ``bernoulli_``, ``div_``, ``mul``: four bytes per element
kept), while CUDA runs the fused ``aten.native_dropout`` with a one-byte
boolean mask. Out-of-place training dropout with 0 < p < 1 is routed to
``native_dropout``, as CUDA's ``at::dropout`` does.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["attention_emulation", "CudaAttentionEmulation", "attention_kernel", "flex_attention_error"]

aten = torch.ops.aten


def attention_kernel(q: torch.Tensor, k: torch.Tensor, attn_mask: Any, enable_gqa: bool) -> str:
    """Which kernel a CUDA target would pick: 'flash', 'efficient' or 'math'."""
    if q.dim() != 4 or k.dim() != 4:
        return "math"
    same_heads = q.size(1) == k.size(1)
    grouped = enable_gqa and k.size(1) > 0 and q.size(1) % k.size(1) == 0
    if q.dtype in (torch.float16, torch.bfloat16) and attn_mask is None and q.size(-1) <= 256:
        if same_heads or grouped:
            return "flash"
    return "efficient" if same_heads else "math"


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    kernel = attention_kernel(query, key, attn_mask, enable_gqa)
    return kernel, _run(kernel, query, key, value, attn_mask, dropout_p, is_causal, scale)


def _run(kernel, query, key, value, attn_mask, dropout_p, is_causal, scale):
    if kernel == "flash":
        return torch.ops.aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, scale=scale
        )[0]
    if kernel == "efficient":
        bias = attn_mask
        if bias is not None and bias.dtype == torch.bool:
            bias = torch.zeros_like(bias, dtype=query.dtype).masked_fill_(~bias, float("-inf"))
        needs_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, bias, needs_lse, dropout_p, is_causal, scale=scale
        )[0]
    return None


def _dropout(input, p=0.5, training=True, inplace=False):
    if not training or inplace or not 0 < p < 1 or input.numel() == 0:
        return None
    return aten.native_dropout(input, p, True)[0]


class CudaAttentionEmulation(TorchFunctionMode):
    """Routes attention and dropout to the CUDA kernels a target would run (see the module doc)."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels: dict[str, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.dropout:
            out = _dropout(*args, **kwargs)
            if out is not None:
                self.kernels["native_dropout"] = self.kernels.get("native_dropout", 0) + 1
                return out
        if func is F.scaled_dot_product_attention:
            kernel, out = _sdpa(*args, **kwargs)
            self.kernels[kernel] = self.kernels.get(kernel, 0) + 1
            if out is not None:
                return out
        return func(*args, **kwargs)


def attention_emulation(enabled: bool) -> Any:
    """The emulation of CUDA's attention kernels when collecting for a CUDA target, else a no-op context."""
    return CudaAttentionEmulation() if enabled else nullcontext()


def flex_attention_error(exc: BaseException) -> RuntimeError | None:
    """A clear error for a step that calls FlexAttention, which sacplan does not collect (see the module doc);
    None for any other error."""
    text = str(exc)
    if not isinstance(exc, NotImplementedError) or ("FlexAttention" not in text and "flex_attention" not in text):
        return None
    return RuntimeError(
        "the model calls FlexAttention (torch.nn.attention.flex_attention), which sacplan cannot collect yet: on the "
        "CPU PyTorch refuses its backward (no CPU kernel; sacplan emulates CUDA's flash and memory-efficient "
        "attention for a CUDA target, not FlexAttention's compiled kernel), and the collector does not record its "
        "higher-order op on any device. Collect the model with F.scaled_dot_product_attention in its place (a "
        "causal block mask, one document a row: is_causal=True; CUDA's flash attention saves the same tensors, "
        "q, k, v, the output and the logsumexp); for torchtitan's Llama 3, bench/torchtitan_llama.py with "
        f"SACPLAN_TT_ATTENTION=sdpa (docs/tensor-parallel.md, \"torchtitan's way\"). PyTorch said: {text[:200]}")

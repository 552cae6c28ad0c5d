"""torchtitan's Llama 3, from its own model registry, as a ``sacplan collect --model`` factory.

Needs the ``torchtitan`` package (0.3.0, installed beside our torch: see docs/tensor-parallel.md,
"torchtitan's way"); sacplan itself never imports it. The flavor is torchtitan's (``debugmodel``, ``1B``,
``3B``, ``8B``, ``70B``, ``405B``), chosen with ``SACPLAN_TT_FLAVOR`` (default ``debugmodel``), and
sequence parallel (torchtitan's default, ``parallelism.enable_sequence_parallel``) with
``SACPLAN_TT_SEQUENCE_PARALLEL=0`` or ``1`` (default 1): both are fixed when the model's config is made,
as torchtitan's trainer fixes them (``update_from_config``) before it builds the model on meta.

Attention (``SACPLAN_TT_ATTENTION``): ``flex`` (default) is torchtitan's default for language models,
FlexAttention, with a causal block mask the model builds in its forward from the batch's shape (a forward
pre-hook: torchtitan's trainer passes ``attention_masks`` built from the batch's positions; one document per
row here); sacplan cannot collect it yet and says why. ``sdpa`` puts torchtitan's own
``ScaledDotProductAttention`` (causal) in each layer's ``inner_attention`` in its place (torchtitan 0.3.0's
registry refuses ``attn_backend="sdpa"`` for language models, as its batches carry document positions): for
one document a row it computes the same attention, and CUDA's flash attention, which sacplan emulates for a
CUDA target, saves what FlexAttention's kernel saves (q, k, v, the output, the logsumexp). The loss is cross entropy on this rank's vocabulary shard of the logits (torchtitan's
``lm_head`` leaves them sharded on the vocabulary for its ``loss_parallel``; the shapes a rank keeps are the
same, the value is a stand-in).
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import torch
import torch.nn.functional as F

__all__ = ["make_model", "tt_flavor"]


def tt_flavor() -> tuple[str, bool, str]:
    """(torchtitan's Llama 3 flavor, sequence parallel, attention) from the environment."""
    flavor = os.environ.get("SACPLAN_TT_FLAVOR", "debugmodel")
    sp = os.environ.get("SACPLAN_TT_SEQUENCE_PARALLEL", "1")
    if sp not in ("0", "1"):
        raise ValueError(f"SACPLAN_TT_SEQUENCE_PARALLEL must be 0 or 1, got {sp!r}")
    attention = os.environ.get("SACPLAN_TT_ATTENTION", "flex")
    if attention not in ("flex", "sdpa"):
        raise ValueError(f"SACPLAN_TT_ATTENTION must be flex or sdpa, got {attention!r}")
    return flavor, sp == "1", attention


def _causal_masks_in_forward(model: torch.nn.Module) -> None:
    """The model's forward builds its causal flex-attention block mask from the tokens when none is given."""
    from torch.nn.attention.flex_attention import create_block_mask

    block_size = model.config.first_attention.inner_attention.block_size

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def add_masks(module, args, kwargs):
        if kwargs.get("attention_masks") is not None or len(args) > 2:
            return None
        tokens = args[0] if args else kwargs["tokens"]
        seq = tokens.shape[1]
        masks = create_block_mask(causal, tokens.shape[0], None, seq, seq, device=tokens.device,
                                  BLOCK_SIZE=block_size)
        return args, {**kwargs, "attention_masks": masks}

    model.register_forward_pre_hook(add_masks, with_kwargs=True)


def make_model(batch_size: int, seq_len: int, dtype: torch.dtype, device: torch.device):
    """torchtitan's Llama 3 (``SACPLAN_TT_FLAVOR``) built on ``device`` from its registry, a batch of tokens, and a
    loss."""
    from torchtitan.config import ParallelismConfig
    from torchtitan.models.llama3 import model_registry

    flavor, sequence_parallel, attention = tt_flavor()
    config = model_registry(flavor).model  # attn_backend "flex", torchtitan's default
    if attention == "sdpa":
        from torchtitan.models.common.attention import ScaledDotProductAttention

        for layer in config.layers:  # before update_from_config, which sets each one's sharding
            layer.attention.inner_attention = ScaledDotProductAttention.Config()
    parallelism = ParallelismConfig(enable_sequence_parallel=sequence_parallel, spmd_backend="partial_dtensor")
    config.update_from_config(config=SimpleNamespace(parallelism=parallelism))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = config.build()
    finally:
        torch.set_default_dtype(previous)
    model._no_split_modules = [type(model.layers["0"]).__name__]  # FSDP2's units: one a block, as torchtitan's
    if attention == "flex":
        _causal_masks_in_forward(model)
    vocab = config.vocab_size
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (batch_size, seq_len), generator=gen)
    labels = torch.randint(0, vocab, (batch_size, seq_len), generator=gen)

    def loss_fn(logits):
        local = logits.to_local() if hasattr(logits, "to_local") else logits
        shard = local.shape[-1]
        return F.cross_entropy(local.flatten(0, 1).float(), labels.flatten() % shard)

    return model, (tokens,), loss_fn

"""A Hugging Face decoder cut into pipeline stages, as torchtitan cuts its models.

Each stage keeps its own decoder layers; the token embedding goes with the
first stage, the final norm and the LM head with the last; every stage has the
rotary embedding (it has no parameters: each stage makes its own cos/sin).
The stage's modules keep the whole model's FQNs (``model.layers.5``), so split
points and plans read the same on the model and on its stages.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from estimators.common.pipeline_setup import PipelineSetup
from estimators.common.tensor_parallel import hf_tp_plan

__all__ = ["DecoderStage", "RankChunks", "build_stages", "decoder_parts", "stage_layer_ids"]

_LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)$")


def decoder_parts(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(the decoder trunk ``model.model``, the LM head) of a causal LM; ValueError for other models."""
    trunk, head = getattr(model, "model", None), getattr(model, "lm_head", None)
    needs = ("embed_tokens", "layers", "norm", "rotary_emb")
    if trunk is None or head is None or not all(hasattr(trunk, n) for n in needs):
        raise ValueError(f"pipeline stages are built for Hugging Face decoders (model.embed_tokens, model.layers, "
                         f"model.norm, model.rotary_emb, lm_head); {type(model).__name__} has not these")
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        raise ValueError(f"{type(model).__name__} ties its embedding to its LM head (tie_word_embeddings): the first "
                         f"and last stages would share a parameter; set tie_word_embeddings false")
    return trunk, head


def stage_layer_ids(n_layers: int, setup: PipelineSetup) -> list[list[int]]:
    """The decoder layer indices of each model chunk: equal counts (earlier chunks take the remainder), or the split."""
    chunks = setup.chunks
    if setup.split is None:
        if n_layers < chunks:
            raise ValueError(f"pp_stages {setup.stages} x pp_virtual_stages {setup.virtual_stages} = {chunks} chunks "
                             f"need at least {chunks} decoder layers, the model has {n_layers}")
        base, extra = divmod(n_layers, chunks)
        sizes = [base + (1 if c < extra else 0) for c in range(chunks)]
        starts = [sum(sizes[:c]) for c in range(chunks)]
        return [list(range(s, s + n)) for s, n in zip(starts, sizes)]
    starts = [0]
    for k, fqn in enumerate(setup.split):
        m = _LAYER.match(fqn)
        if m is None:
            raise ValueError(f"pp_split[{k}] {fqn!r} is not a decoder layer (model.layers.N)")
        start = int(m.group(1))
        if not starts[-1] < start < n_layers:
            raise ValueError(f"pp_split[{k}] {fqn!r} must come after the previous split point and before layer "
                             f"{n_layers} (the model has {n_layers} layers)")
        starts.append(start)
    return [list(range(a, b)) for a, b in zip(starts, starts[1:] + [n_layers])]


class _Trunk(nn.Module):
    def __init__(self, trunk: nn.Module, layer_ids: list[int], first: bool, last: bool):
        super().__init__()
        self.embed_tokens = trunk.embed_tokens if first else None
        self.layers = nn.ModuleDict({str(i): trunk.layers[i] for i in layer_ids})
        self.norm = trunk.norm if last else None
        self.rotary_emb = trunk.rotary_emb


class DecoderStage(nn.Module):
    """One pipeline stage of a decoder: token ids (first stage) or hidden states in; hidden states or logits out."""

    def __init__(self, model: nn.Module, layer_ids: list[int], *, first: bool, last: bool):
        super().__init__()
        trunk, head = decoder_parts(model)
        self.model = _Trunk(trunk, layer_ids, first, last)
        self.lm_head = head if last else None
        self.config = getattr(model, "config", None)
        self.tp_plan = hf_tp_plan(model)  # the model's FQNs are the stage's: its HF plan names the stage's modules
        self._no_split_modules = getattr(model, "_no_split_modules", None)  # FSDP2's units: the decoder layers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        trunk = self.model
        h = trunk.embed_tokens(x) if trunk.embed_tokens is not None else x
        position_ids = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
        cos_sin = trunk.rotary_emb(h, position_ids=position_ids)
        for layer in trunk.layers.values():  # no mask: SDPA's causal attention, as the whole model runs it
            h = layer(h, attention_mask=None, position_ids=position_ids, position_embeddings=cos_sin)
        if trunk.norm is not None:
            h = trunk.norm(h)
        return self.lm_head(h) if self.lm_head is not None else h


def build_stages(model: nn.Module, setup: PipelineSetup) -> list[DecoderStage]:
    """Every model chunk of ``model`` as a stage module, in pipeline order (sharing the model's modules)."""
    trunk, _ = decoder_parts(model)
    ids = stage_layer_ids(len(trunk.layers), setup)
    last = len(ids) - 1
    return [DecoderStage(model, layer_ids, first=c == 0, last=c == last) for c, layer_ids in enumerate(ids)]


class RankChunks(nn.Module):
    """One rank's model chunks under interleaved 1F1B as one module with the whole model's FQNs (a plan of the
    rank applies to it, and so to each chunk: they share the modules): ``forward(x_0, ..., x_V-1)`` runs chunk v
    on x_v and returns every chunk's output."""

    def __init__(self, model: nn.Module, chunks: list[DecoderStage]):
        super().__init__()
        trunk, head = decoder_parts(model)
        ids = [int(i) for c in chunks for i in c.model.layers]
        first = any(c.model.embed_tokens is not None for c in chunks)
        last = any(c.lm_head is not None for c in chunks)
        self.model = _Trunk(trunk, ids, first, last)
        self.lm_head = head if last else None
        self.config = getattr(model, "config", None)
        self.tp_plan = hf_tp_plan(model)
        self.__dict__["chunks"] = list(chunks)  # not submodules: their modules are this one's already

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if len(xs) != len(self.chunks):
            raise ValueError(f"RankChunks takes one input per chunk ({len(self.chunks)}), got {len(xs)}")
        return tuple(chunk(x) for chunk, x in zip(self.chunks, xs))

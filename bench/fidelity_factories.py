"""Models for the fidelity harness beyond the shared reference set (``bench/fidelity.py``).

``make_shared_encoder``: one encoder layer applied several times (ALBERT's
cross-layer parameter sharing), so the modules of that layer are called more
than once in a step; for ``sacplan collect --model
bench/fidelity_factories.py:make_shared_encoder``.

``make_twice_mlp``: blocks whose one feed-forward is applied twice (a
submodule its parent calls twice), each time after its own norm.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SharedLayerEncoder(nn.Module):
    """Token embedding, one ``nn.TransformerEncoderLayer`` run ``repeats`` times, mean pooling, a linear head."""

    def __init__(self, vocab: int = 2048, dim: int = 128, heads: int = 4, mlp: int = 512, repeats: int = 4,
                 classes: int = 10, dropout: float = 0.1):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layer = nn.TransformerEncoderLayer(dim, heads, mlp, dropout=dropout, batch_first=True)
        self.repeats = repeats
        self.head = nn.Linear(dim, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for _ in range(self.repeats):
            x = self.layer(x)
        return self.head(x.mean(1))


class TwiceMLPBlock(nn.Module):
    """Attention, then one MLP applied twice, each with its own pre-norm and residual."""

    def __init__(self, dim: int, heads: int, mlp: int, dropout: float):
        super().__init__()
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(), nn.Linear(mlp, dim), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        x = x + self.mlp(self.norm2(x))
        return x + self.mlp(self.norm3(x))


class TwiceMLPEncoder(nn.Module):
    """Token embedding, ``depth`` :class:`TwiceMLPBlock`, mean pooling, a linear head."""

    def __init__(self, vocab: int = 2048, dim: int = 128, heads: int = 4, mlp: int = 512, depth: int = 2,
                 classes: int = 10, dropout: float = 0.1):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(TwiceMLPBlock(dim, heads, mlp, dropout) for _ in range(depth))
        self.head = nn.Linear(dim, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(1))


def _class_loss(out: torch.Tensor) -> torch.Tensor:
    # targets derived from the output's shape: the same under fake and real tensors, on any device
    return F.cross_entropy(out, torch.arange(out.shape[0], device=out.device) % out.shape[1])


def make_shared_encoder(batch_size: int, seq_len: int, device: str | torch.device):
    """The factory ``sacplan collect --model`` calls: (model, inputs, loss function)."""
    with torch.device(device):
        model = SharedLayerEncoder()
        ids = torch.randint(0, 2048, (batch_size, seq_len))
    model.train()
    return model, (ids,), _class_loss


def make_twice_mlp(batch_size: int, seq_len: int, device: str | torch.device):
    """The factory ``sacplan collect --model`` calls: (model, inputs, loss function)."""
    with torch.device(device):
        model = TwiceMLPEncoder()
        ids = torch.randint(0, 2048, (batch_size, seq_len))
    model.train()
    return model, (ids,), _class_loss

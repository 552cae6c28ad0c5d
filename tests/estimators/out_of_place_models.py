"""Models whose modules do not all run where their names place them (factories for ``sacplan collect``).

The three shapes of the user audit: a submodule run from outside its parent's
forward (LLaVA's ``get_input_embeddings()``), one module registered twice
(T5's ``shared`` embedding, also the encoder's), a child running its
parent's other child; and a review's: a child first run on its parent's
second call.
"""

from __future__ import annotations

import torch
from torch import nn

DIM = 32


class Block(nn.Module):
    def __init__(self, d: int = DIM):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


class Encoder(nn.Module):
    def __init__(self, d: int = DIM):
        super().__init__()
        self.head = Block(d)  # run by the model, never by the encoder
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


class OutOfParent(nn.Module):
    def __init__(self, d: int = DIM):
        super().__init__()
        self.enc, self.out = Encoder(d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.enc(self.enc.head(x)))


class EmbeddingEncoder(nn.Module):
    def __init__(self, embed: nn.Embedding, d: int = DIM):
        super().__init__()
        self.embed, self.fc, self.fc2 = embed, nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc(self.embed(ids))))


class Tied(nn.Module):
    def __init__(self, d: int = DIM, vocab: int = 64):
        super().__init__()
        self.shared = nn.Embedding(vocab, d)  # named Tied.shared, run as Tied.enc.embed
        self.enc, self.out = EmbeddingEncoder(self.shared, d), nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.enc(ids))


class Decoder(nn.Module):
    def __init__(self, d: int = DIM):
        super().__init__()
        self.fc, self.fc2 = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        return self.fc2(norm(torch.relu(self.fc(x))))


class SiblingCall(nn.Module):
    def __init__(self, d: int = DIM):
        super().__init__()
        self.norm, self.dec = nn.LayerNorm(d), Decoder(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dec(x, self.norm)


def out_of_parent(batch_size: int, seq_len: int, device: torch.device):
    with torch.device(device):
        return OutOfParent(), (torch.randn(batch_size, seq_len, DIM),)


def tied(batch_size: int, seq_len: int, device: torch.device):
    with torch.device(device):
        return Tied(), (torch.randint(0, 64, (batch_size, seq_len)),)


def sibling_call(batch_size: int, seq_len: int, device: torch.device):
    with torch.device(device):
        return SiblingCall(), (torch.randn(batch_size, seq_len, DIM),)


class Gate(nn.Module):
    def __init__(self, d: int = DIM):
        super().__init__()
        self.fc, self.calls = nn.Linear(d, d), 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return torch.relu(x) if self.calls % 2 else self.fc(x)  # fc runs only on every second call


class TwoCalls(nn.Module):
    def __init__(self, d: int = DIM):
        super().__init__()
        self.gate, self.out = Gate(d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.gate(self.gate(x)))


def two_calls(batch_size: int, seq_len: int, device: torch.device):
    with torch.device(device):
        return TwoCalls(), (torch.randn(batch_size, seq_len, DIM),)

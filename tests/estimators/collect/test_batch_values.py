"""Model code that reads the batch's values: collected on the path the real batch takes (issue 27, item 3).

Two models of the kinds the issue names, without Hugging Face: one that
truncates the batch to its longest row (``.item()`` on per-row lengths),
one that drops the padded tokens before its MLP (``nonzero``, as
flash-attention's unpadding does). Their stats follow the real batch: the
tensors have the shapes the real run makes (known answers: the row lengths
given), and the reads are recorded. Inputs made on ``meta`` have no values:
the collection says so and how to fix it.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from estimators import RooflineCostModel, collect_stats, device_spec  # noqa: E402

HIDDEN = 16


class Truncating(nn.Module):
    """Cuts the batch to its longest row, then an MLP block (the op list the stats check)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, HIDDEN)
        self.block = nn.Sequential(nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(), nn.Linear(4 * HIDDEN, HIDDEN))

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        longest = int(mask.sum(-1).max().item())
        return self.block(self.embed(ids[:, :longest])).sum()


class Unpadding(nn.Module):
    """Runs its MLP on the real tokens only: the padded ones are dropped by index (``nonzero``)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, HIDDEN)
        self.block = nn.Sequential(nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(), nn.Linear(4 * HIDDEN, HIDDEN))

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        keep = mask.flatten().nonzero().squeeze(-1)
        tokens = self.embed(ids).flatten(0, 1).index_select(0, keep)
        return self.block(tokens).sum()


def _batch(lengths: list[int], seq: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.zeros(len(lengths), seq, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    return torch.randint(0, 50, (len(lengths), seq)), mask


def _collect(model: nn.Module, inputs: tuple) -> object:
    return collect_stats(model, inputs, optimizer="none", device="cpu",
                         cost_model=RooflineCostModel(device_spec("cpu")))


def _first_linear_bytes(stats: object, fqn: str) -> int:
    ops = stats.module(fqn).ops
    return next(op.output_bytes for op in ops if op.name == "aten.addmm")


def test_per_row_lengths_read_with_item_give_the_real_shapes():
    torch.manual_seed(0)
    stats = _collect(Truncating(), _batch([20, 12, 7]))
    # the longest row has 20 tokens: the block's first linear makes 3 x 20 x 64 floats, not 3 x 32 x 64
    assert _first_linear_bytes(stats, "Truncating.block") == 3 * 20 * 4 * HIDDEN * 4
    assert stats.metadata.tags["batch_values_read"] == "aten._local_scalar_dense x1"


def test_padded_tokens_dropped_by_nonzero_give_the_real_shapes():
    torch.manual_seed(0)
    stats = _collect(Unpadding(), _batch([20, 12, 7]))
    assert _first_linear_bytes(stats, "Unpadding.block") == (20 + 12 + 7) * 4 * HIDDEN * 4
    assert stats.metadata.tags["batch_values_read"] == "aten.nonzero x1"


def test_the_batch_is_left_as_it_was():
    ids, mask = _batch([20, 12, 7])
    before = ids.clone(), mask.clone()
    _collect(Unpadding(), (ids, mask))
    assert torch.equal(ids, before[0]) and torch.equal(mask, before[1])


def test_a_batch_made_on_meta_has_no_values_and_the_error_says_how_to_give_them():
    ids, mask = _batch([20, 12, 7])
    with pytest.raises(ValueError, match=r"reads the values of a tensor \(aten._local_scalar_dense\).*on the CPU"):
        _collect(Truncating(), (ids.to("meta"), mask.to("meta")))

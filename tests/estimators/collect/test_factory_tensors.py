"""Tensors a factory makes on the collection device: returned as inputs, captured by loss_fn, or held elsewhere."""

from __future__ import annotations

import functools
import json

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from estimators import RooflineCostModel, collect_stats, device_spec  # noqa: E402
from planner import load_stats  # noqa: E402
from planner.cli import main  # noqa: E402

FACTORIES = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 10)

    def forward(self, x, labels=None):
        out = self.b(torch.relu(self.a(x)))
        return out if labels is None else nn.functional.cross_entropy(out, labels)


def captured(batch_size, device):
    labels = torch.randint(0, 10, (batch_size,), device=device)
    x = torch.randn(batch_size, 16, device=device)
    return Net().to(device), (x,), lambda out: nn.functional.cross_entropy(out, labels)


def returned(batch_size, device):
    labels = torch.randint(0, 10, (batch_size,), device=device)
    x = torch.randn(batch_size, 16, device=device)
    return Net().to(device), {"x": x, "labels": labels}
'''


@pytest.mark.parametrize("factory", ["captured", "returned"])
def test_factory_tensors_made_on_the_collection_device_collect(tmp_path, factory):
    path = tmp_path / "factories.py"
    path.write_text(FACTORIES)
    out = tmp_path / "stats.json"
    rc = main(["collect", "--model", f"{path}:{factory}", "--batch", "4", "--out", str(out), "--quiet"])
    assert rc == 0
    stats = load_stats(out)
    # the loss ran on the labels and the backward reached the first layer: its weight and bias gradients
    assert stats.module("Net.a").grad_bytes == (16 * 32 + 32) * 4
    assert json.loads(out.read_text())["metadata"]["input_shape"] == [4, 16]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 10)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _collect(model, inputs, loss_fn):
    return collect_stats(model, inputs, loss_fn=loss_fn, optimizer="none", device="cpu",
                         cost_model=RooflineCostModel(device_spec("cpu")))


def _labelled(labels):
    return lambda out: nn.functional.cross_entropy(out, labels)


@pytest.mark.parametrize("make_loss", [
    _labelled,
    lambda labels: functools.partial(nn.functional.cross_entropy, target=labels),
    lambda labels: (lambda crit: lambda out: crit(out, labels))(nn.CrossEntropyLoss(weight=torch.rand(10))),
], ids=["closure", "partial", "loss module with a weight"])
def test_captured_tensors_are_made_fake_and_given_back(make_loss):
    torch.manual_seed(0)
    model, x, labels = Net(), torch.randn(4, 16), torch.randint(0, 10, (4,))
    loss_fn = make_loss(labels)
    stats = _collect(model, (x,), loss_fn)
    assert stats.module("Net.a").grad_bytes == (16 * 32 + 32) * 4
    real = loss_fn(model(x))  # the closure holds the real labels again: a fake one would fail here
    assert real.shape == () and torch.isfinite(real)
    assert model.a.weight.device.type == "cpu" and not type(model.a.weight).__name__.startswith("Fake")


LABELS = torch.randint(0, 10, (4,))


def test_a_global_tensor_in_loss_fn_is_named_with_the_fix():
    with pytest.raises(ValueError, match=r"real tensor the fake collection cannot see: loss_fn's global 'LABELS' "
                                         r"\(in aten\.nll_loss_forward.*capture it in loss_fn's closure"):
        _collect(Net(), (torch.randn(4, 16),), lambda out: nn.functional.cross_entropy(out, LABELS))


class Masked(Net):
    def __init__(self):
        super().__init__()
        self.mask = torch.ones(10)  # neither a parameter nor a buffer

    def forward(self, x):
        return super().forward(x) * self.mask


def test_a_plain_tensor_attribute_of_the_model_is_named_with_the_fix():
    with pytest.raises(ValueError, match=r"model attribute Masked\.mask \(neither a parameter nor a buffer\).*"
                                         r"register_buffer\(name, tensor, persistent=False\)"):
        _collect(Masked(), (torch.randn(4, 16),), lambda out: out.sum())

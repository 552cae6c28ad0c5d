"""Small real models for the estimator tests: the torch-test transformer and a tiny HF Llama."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

from estimators import RooflineCostModel, collect_stats, device_spec  # noqa: E402
from est_helpers import TINY_LLAMA  # noqa: E402
from planner import Stats  # noqa: E402

@dataclass
class Case:
    name: str
    model: Any
    inputs: Any
    loss: Callable[[Any], Any]
    layers: list[str]  # fqns of the decoder layers
    stats: Stats

    def call(self, model: Any = None) -> Any:
        m = model if model is not None else self.model
        return m(**self.inputs) if isinstance(self.inputs, dict) else m(*self.inputs)

    def fresh_copy(self) -> Any:
        return copy.deepcopy(self.model)


def torch_test_transformer() -> tuple[Any, tuple]:
    from torch.testing._internal.distributed._tensor.common_dtensor import ModelArgs, Transformer

    torch.manual_seed(0)
    args = ModelArgs(n_layers=2, vocab_size=128, max_seq_len=32, dim=64, n_heads=4, dropout_p=0.1)
    return Transformer(args), (torch.randint(0, 128, (2, 32)),)


def tiny_llama() -> tuple[Any, dict]:
    from estimators import build_from_hf_config

    torch.manual_seed(0)
    built = build_from_hf_config(TINY_LLAMA, batch_size=2, seq_len=32, dtype=torch.float32,
                                 device=torch.device("cpu"))
    return built.model, built.inputs


def _collect(model: Any, inputs: Any) -> Stats:
    return collect_stats(model, inputs, optimizer="adamw", device="cpu",
                         cost_model=RooflineCostModel(device_spec("cpu")))


@pytest.fixture(scope="session")
def transformer_case() -> Case:
    model, inputs = torch_test_transformer()
    layers = [f"Transformer.layers.{i}" for i in range(2)]
    return Case("transformer", model, inputs, lambda out: out.sum(), layers, _collect(model, inputs))


@pytest.fixture(scope="session")
def llama_case() -> Case:
    model, inputs = tiny_llama()
    layers = [f"LlamaForCausalLM.model.layers.{i}" for i in range(2)]
    return Case("llama", model, inputs, lambda out: out.loss, layers, _collect(model, inputs))


@pytest.fixture(params=["transformer", "llama"])
def case(request: Any) -> Case:
    return request.getfixturevalue(f"{request.param}_case")


@pytest.fixture(scope="module")
def one_thread():
    """Torch on one thread for a module's tests (real-step peaks and timings as the benches take them)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

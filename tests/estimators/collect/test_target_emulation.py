"""Target emulation: a CPU collection for a CUDA target sees CUDA's attention and dropout kernels."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from est_helpers import TINY_LLAMA  # noqa: E402
from estimators import RooflineCostModel, build_from_hf_config, collect_stats, device_spec  # noqa: E402

B, H, S, D = 2, 4, 128, 64


def _transformer(dtype):
    from torch.testing._internal.distributed._tensor.common_dtensor import ModelArgs, Transformer

    with torch.device("meta"):
        model = Transformer(ModelArgs(n_layers=2, vocab_size=128, max_seq_len=S, dim=D, n_heads=H, dropout_p=0.1))
        tokens = torch.randint(0, 128, (B, S))
    return model.to(dtype), (tokens,)


def _collect(model, inputs, emulate):
    return collect_stats(model, inputs, cost_model=RooflineCostModel(device_spec("h100-sxm")),
                         emulate_cuda_attention=emulate)


@pytest.mark.parametrize("dtype,kernel", [(torch.bfloat16, "flash"), (torch.float32, "efficient")])
def test_attention_matrix_is_not_materialized(dtype, kernel):
    model, inputs = _transformer(dtype)
    cpu = _collect(model, inputs, emulate=False).module("Transformer.layers.0")
    cuda = _collect(model, inputs, emulate=True).module("Transformer.layers.0")
    matrix_bytes = B * H * S * S * dtype.itemsize  # one (batch, heads, seq, seq) attention matrix
    assert max(op.output_bytes for op in cpu.ops) >= matrix_bytes  # the CPU math path builds it
    assert max(op.output_bytes for op in cuda.ops) < matrix_bytes
    assert f"aten._scaled_dot_product_{kernel}_attention" in {op.name for op in cuda.ops}
    assert cuda.act_saved_bytes < cpu.act_saved_bytes / 2
    # CUDA's fused dropout: one op, random, instead of empty_like/bernoulli_/div_/mul.
    dropout = [op for op in cuda.ops if op.name == "aten.native_dropout"]
    assert len(dropout) == 2 and all(op.random for op in dropout)
    assert "aten.bernoulli_" not in {op.name for op in cuda.ops}


def test_meta_built_llama_with_gqa_goes_to_flash():
    built = build_from_hf_config(TINY_LLAMA, batch_size=1, seq_len=64, dtype=torch.bfloat16,
                                 device=torch.device("meta"))
    stats = _collect(built.model, built.inputs, emulate=True)
    names = [op.name for op in stats.module("LlamaForCausalLM.model.layers.0").ops]
    assert "aten._scaled_dot_product_flash_attention" in names
    assert stats.metadata.tags["attention_kernels"] == "flash:2"


class _FlexBlock(torch.nn.Module):
    """One projection then FlexAttention (causal via its default block mask: none), as torchtitan's inner attention
    calls it."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(D, 3 * D)

    def forward(self, x):
        from torch.nn.attention.flex_attention import flex_attention

        q, k, v = self.qkv(x).view(B, S, 3, H, D // H).permute(2, 0, 3, 1, 4)
        return flex_attention(q, k, v)


@pytest.mark.parametrize("emulate", [False, True])
def test_flex_attention_is_refused_with_what_to_do(emulate):
    # PyTorch refuses FlexAttention's backward on CPU tensors (torch/nn/attention/flex_attention.py,
    # _validate_device); a CUDA target's emulation does not cover it either: the error says so and what to do
    with torch.device("meta"):
        model = _FlexBlock()
    with pytest.raises(RuntimeError, match=r"FlexAttention .*cannot collect yet.*scaled_dot_product_attention"):
        _collect(model, (torch.randn(B, S, D),), emulate=emulate)

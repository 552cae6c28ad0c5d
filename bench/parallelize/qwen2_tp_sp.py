"""A user's tensor- and sequence-parallel function for Qwen2-style decoders (torchtitan's way: called with the model
and the TP mesh), as ``sacplan collect --tp-size 2 --sequence-parallel --parallelize
bench/parallelize/qwen2_tp_sp.py:parallelize`` takes it.

Megatron's split with sequence parallel (Korthikanti et al. 2022), written with ``parallelize_module``'s styles
only: the residual stream between blocks stays on sequence shards (``Shard(1)``, a DTensor): the embedding's
partial rows are reduce-scattered onto them, every norm outside attention and the MLP (a layer's two, the final
one) runs on its shard (``SequenceParallel``), each column-wise projection (q, k, v with their biases, gate, up,
the LM head) gathers its input from the shards itself (``input_layouts=Shard(1)``: one all-gather per projection,
simpler than one per block and more memory, as such a user writes it), and each row-wise projection
reduce-scatters its partial sums back onto the shards. Attention dropout (the config's ``attention_dropout``)
runs on this rank's heads.
"""

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module


def parallelize(model, tp_mesh):
    def gathered(**kw):
        return ColwiseParallel(input_layouts=Shard(1), **kw)

    def scattered():
        return RowwiseParallel(output_layouts=Shard(1), use_local_output=False)

    plan = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1),
                                                  use_local_output=False),
            "model.norm": SequenceParallel(),
            "lm_head": gathered(output_layouts=Replicate())}
    for k in range(len(model.model.layers)):
        prefix = f"model.layers.{k}"
        plan.update({f"{prefix}.input_layernorm": SequenceParallel(),
                     f"{prefix}.post_attention_layernorm": SequenceParallel()})
        plan.update({f"{prefix}.self_attn.{name}": gathered() for name in ("q_proj", "k_proj", "v_proj")})
        plan.update({f"{prefix}.mlp.{name}": gathered() for name in ("gate_proj", "up_proj")})
        plan.update({f"{prefix}.self_attn.o_proj": scattered(), f"{prefix}.mlp.down_proj": scattered()})
    parallelize_module(model, tp_mesh, plan)

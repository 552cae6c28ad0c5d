"""A user's tensor- and sequence-parallel function for Qwen2-style decoders written as torchtitan writes its
Llama's (called with the model and the TP mesh), as ``sacplan collect --tp-size 2 --sequence-parallel
--parallelize bench/parallelize/qwen2_tp_sp_blocks.py:parallelize`` takes it.

As ``qwen2_tp_sp.py`` (the residual stream on sequence shards, the norms ``SequenceParallel``, row-wise
projections reduce-scattering onto the shards), but each block gathers its hidden states once, on entry, in a
forward pre-hook (``PrepareModuleInput`` on attention, whose hidden states come as a keyword, and on the MLP),
and its column-wise projections (q, k, v with their biases; gate, up) share the gathered copy. ``apply_plan``
runs a planned block's pre-hooks inside its checkpoint, as torchtitan's checkpoint wrapper does.
"""

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)


def parallelize(model, tp_mesh):
    def scattered():
        return RowwiseParallel(output_layouts=Shard(1), use_local_output=False)

    plan = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1),
                                                  use_local_output=False),
            "model.norm": SequenceParallel(),
            "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())}
    for k in range(len(model.model.layers)):
        prefix = f"model.layers.{k}"
        plan.update({
            f"{prefix}.input_layernorm": SequenceParallel(),
            f"{prefix}.post_attention_layernorm": SequenceParallel(),
            f"{prefix}.self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                                      desired_input_kwarg_layouts={"hidden_states": Replicate()}),
            f"{prefix}.mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            f"{prefix}.self_attn.o_proj": scattered(),
            f"{prefix}.mlp.down_proj": scattered(),
        })
        plan.update({f"{prefix}.self_attn.{name}": ColwiseParallel() for name in ("q_proj", "k_proj", "v_proj")})
        plan.update({f"{prefix}.mlp.{name}": ColwiseParallel() for name in ("gate_proj", "up_proj")})
    parallelize_module(model, tp_mesh, plan)

"""A user's tensor-parallel function for Qwen2-style decoders (torchtitan's way: called with the model and the
TP mesh), as ``sacplan collect --parallelize bench/parallelize/qwen2_tp.py:parallelize`` takes it.

Megatron's split: attention heads and the MLP's hidden units column-wise (q, k, v with their biases, gate and up),
their output projections row-wise, the vocabulary of the embedding row-wise and the LM head's column-wise with
the logits gathered.
"""

from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def parallelize(model, tp_mesh):
    plan = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=Replicate())}
    for k in range(len(model.model.layers)):
        prefix = f"model.layers.{k}"
        plan.update({f"{prefix}.self_attn.{name}": ColwiseParallel() for name in ("q_proj", "k_proj", "v_proj")})
        plan.update({f"{prefix}.mlp.{name}": ColwiseParallel() for name in ("gate_proj", "up_proj")})
        plan.update({f"{prefix}.self_attn.o_proj": RowwiseParallel(), f"{prefix}.mlp.down_proj": RowwiseParallel()})
    parallelize_module(model, tp_mesh, plan)

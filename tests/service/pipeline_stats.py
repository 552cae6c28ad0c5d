"""Small pipeline stage stats written by hand, for the service's pipeline tests (no torch).

tests/planner/test_pipeline.py's stage (a block discarding 500 bytes, two
microbatches collected: the second holds 300 bytes of the first one's
gradients) with its pipeline metadata, stage ``stage`` of ``stages``. Its
known figures (derived there): with 1F1B, 2 stages and 3 microbatches, stage 0
peaks at 2870 bytes without checkpointing and 1870 with the block checkpointed;
stage 1 at 2220 without.
"""

from __future__ import annotations

from typing import Any


def pipeline_stage(stage: int, stages: int = 2, microbatches: int = 3, *, schedule: str = "1f1b",
                   model_name: str = "tiny") -> dict[str, Any]:
    ops = [{"name": "aten.mm", "runtime_ms": 1.0, "output_bytes": 500, "saved_by_autograd": True}]
    timeline = []
    for k in (1, 2):
        grads = 0 if k == 1 else 300
        timeline += [{"phase": "forward", "key": 1, "activation_bytes": 700, "grad_bytes": grads, "micro_batch": k},
                     {"phase": "backward", "key": 2, "activation_bytes": 800, "grad_bytes": grads + 100,
                      "micro_batch": k}]
    timeline.append({"phase": "optimizer", "key": 0, "activation_bytes": 100, "grad_bytes": 300,
                     "optimizer_bytes": 50})
    return {
        "metadata": {"model_name": model_name, "grad_accumulation": 2,
                     "pipeline": {"stage": stage, "stages": stages, "schedule": schedule,
                                  "microbatches": microbatches, "held_bytes": 600, "buffer_bytes": 10,
                                  "input_grad_bytes": 0}},
        "fw_pre_order": ["M", "M.block", "M.head"],
        "fw_post_order": ["M.block", "M.head", "M"],
        "modules": [
            {"fqn": "M", "parent": None, "is_leaf": False, "param_bytes": 1000, "output_bytes": 50,
             "fw_ms": 2.0 + stage, "bw_ms": 4.0},
            {"fqn": "M.block", "parent": "M", "is_leaf": False, "act_saved_bytes": 500, "ops": ops},
            {"fqn": "M.head", "parent": "M", "is_leaf": True},
        ],
        "timeline": timeline,
    }

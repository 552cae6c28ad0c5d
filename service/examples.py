"""Swagger UI examples: a small, consistent stats v1 document (two layers) and requests using it.

Every example request succeeds as it stands on a fresh database: the plan and
sweep requests carry the stats inline (stored as an upload of them would be),
and every budget they ask for fits (``tests/service/docs/test_openapi.py`` holds
them to it).
"""

from __future__ import annotations

from typing import Any

__all__ = ["EXAMPLE_STATS", "EXAMPLE_PLAN_REQUEST", "EXAMPLE_SWEEP_REQUEST"]

MIB = 2**20


def _layer_ops() -> list[dict[str, Any]]:
    # A two-matmul MLP block: the matmuls are dear to recompute, the relu cheap,
    # and the residual add's output is the block output (kept anyway: 0 bytes).
    return [
        {"name": "aten.mm", "runtime_ms": 3.0, "output_bytes": 512 * MIB, "saved_by_autograd": True},
        {"name": "aten.relu", "runtime_ms": 0.25, "output_bytes": 512 * MIB, "saved_by_autograd": True},
        {"name": "aten.mm", "runtime_ms": 3.0, "output_bytes": 512 * MIB, "saved_by_autograd": True},
        {"name": "aten.add", "runtime_ms": 0.25, "output_bytes": 0},
    ]


def _layer(i: int, act_total_mib: int, grad_total_mib: int) -> dict[str, Any]:
    return {
        "fqn": f"Net.layers.{i}",
        "parent": "Net",
        "is_leaf": False,
        "param_bytes": 512 * MIB,
        "grad_bytes": 512 * MIB,
        "act_saved_bytes": 1536 * MIB,
        "act_total_bytes": act_total_mib * MIB,
        "act_grad_bytes": 512 * MIB,
        "grad_total_bytes": grad_total_mib * MIB,
        "input_bytes": 256 * MIB,
        "output_bytes": 256 * MIB,
        "fw_ms": 6.5,
        "bw_ms": 13.0,
        "ops": _layer_ops(),
    }


def _leaf(i: int, act_total_mib: int, grad_total_mib: int) -> dict[str, Any]:
    return {
        "fqn": f"Net.layers.{i}.fc",
        "parent": f"Net.layers.{i}",
        "is_leaf": True,
        "param_bytes": 512 * MIB,
        "grad_bytes": 512 * MIB,
        "act_saved_bytes": 512 * MIB,
        "act_total_bytes": act_total_mib * MIB,
        "act_grad_bytes": 512 * MIB,
        "grad_total_bytes": grad_total_mib * MIB,
        "input_bytes": 256 * MIB,
        "output_bytes": 512 * MIB,
        "fw_ms": 3.0,
        "bw_ms": 6.0,
    }


EXAMPLE_STATS: dict[str, Any] = {
    "format": "sacplan.stats/v1",
    "metadata": {
        "model_name": "two-layer-mlp",
        "batch_size": 8,
        "seq_len": 1024,
        "dtype": "fp32",
        "device": "cpu",
        "target_device": "A100-80GB",  # a device of estimators/collect/devices.py's table
        "tags": {"team": "demo"},
    },
    "fw_pre_order": ["Net", "Net.layers.0", "Net.layers.0.fc", "Net.layers.1", "Net.layers.1.fc"],
    "fw_post_order": ["Net.layers.0.fc", "Net.layers.0", "Net.layers.1.fc", "Net.layers.1", "Net"],
    "modules": [
        {
            "fqn": "Net",
            "parent": None,
            "is_leaf": False,
            "param_bytes": 1024 * MIB,
            "grad_bytes": 1024 * MIB,
            "act_saved_bytes": 3072 * MIB,
            "act_total_bytes": 3328 * MIB,
            "act_grad_bytes": 512 * MIB,
            "grad_total_bytes": 1024 * MIB,
            "output_bytes": 256 * MIB,
            "fw_ms": 13.0,
            "bw_ms": 26.0,
        },
        # Layer 0 ends its forward with its own 1.5 GiB + its output live; layer 1
        # with both layers' activations. Backward runs layer 1 first, so layer 0
        # has accumulated both layers' gradients by its backward.
        _layer(0, 1792, 1024),
        _leaf(0, 768, 1024),
        _layer(1, 3328, 512),
        _leaf(1, 2304, 512),
    ],
}

# The stats have a 5.75 GiB peak without checkpointing and fit 4.25 GiB at best: every budget here fits.
EXAMPLE_PLAN_REQUEST: dict[str, Any] = {
    "stats": EXAMPLE_STATS,
    "memory_budget_gib": 4.5,
    "world_size": 1,
    "ac_units": None,
    "fsdp_units": None,
    "time_limit_s": 10.0,
}

EXAMPLE_SWEEP_REQUEST: dict[str, Any] = {
    "stats": EXAMPLE_STATS,
    "budgets_gib": [4.5, 4.75, 5.0, 5.5, 6.0],
    "world_size": 1,
    "time_limit_s": 10.0,
}

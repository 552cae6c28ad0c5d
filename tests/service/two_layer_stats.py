"""The service tests' stats: a small stats v1 document written by hand (two layers), with known figures.

Its peak without checkpointing is 5.75 GiB and its smallest budget with a
plan 4.25 GiB. It has no timeline (PyTorch's per-module model plans it). The
API docs' example (``service.examples.EXAMPLE_STATS``) is a collected one
instead; these tests keep this one for the figures they know.
"""

from __future__ import annotations

from typing import Any

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


TWO_LAYER_STATS: dict[str, Any] = {
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

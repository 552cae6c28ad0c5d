"""The settings of a model that decide which ops it runs, as the stats name them.

The collector records them in ``StatsMetadata.model_settings``
(:mod:`estimators.collect.settings_record`); applying a plan matches the
model against them (:mod:`estimators.apply.settings_match`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["CONFIG_SETTINGS", "DTYPE_NAMES", "experts_implementation", "model_dtype_name", "model_settings_of"]

# Config attributes that change the op sequence, and the name each gets in the stats.
# (experts_implementation and the MoE routing are recorded by estimators.collect.moe.)
CONFIG_SETTINGS = {"use_cache": "use_cache", "_attn_implementation": "attn_implementation"}
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def model_settings_of(model: nn.Module) -> dict[str, Any]:
    """What the model runs with: ``training`` and the op-deciding settings of a Hugging Face config."""
    out: dict[str, Any] = {"training": bool(model.training)}
    config = getattr(model, "config", None)
    for attr, key in CONFIG_SETTINGS.items():
        value = getattr(config, attr, None) if config is not None else None
        if isinstance(value, (bool, int, float, str)):
            out[key] = value
    return out


def model_dtype_name(model: nn.Module) -> str | None:
    """The stats' name of the model's floating-point parameter dtype (``fp32``, ``bf16``, ``fp16``), or None."""
    p = next((p for p in model.parameters() if p.is_floating_point()), None)
    return DTYPE_NAMES.get(p.dtype) if p is not None else None


def experts_implementation(model: nn.Module) -> str | None:
    """The Hugging Face experts implementation the model runs (``grouped_mm``, ``eager``, ...), or None."""
    config = getattr(model, "config", None)
    value = getattr(config, "_experts_implementation", None) if config is not None else None
    return value if isinstance(value, str) else None

"""The settings of a model that decide which ops it runs, as the stats name them.

The collector records them in ``StatsMetadata.model_settings``
(:mod:`estimators.collect.settings_record`); applying a plan matches the
model against them (:mod:`estimators.apply.settings_match`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["BATCH_VALUES_TAG", "CONFIG_SETTINGS", "DTYPE_NAMES", "UNKNOWN_VALUES_TAG", "experts_implementation",
           "model_config", "model_configs", "model_dtype_name", "model_settings_of", "switch_off_kv_cache"]

# Config attributes that change the op sequence, and the name each gets in the stats.
# (experts_implementation and the MoE routing are recorded by estimators.collect.moe.)
CONFIG_SETTINGS = {"use_cache": "use_cache", "_attn_implementation": "attn_implementation"}
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
# The stats' tags on the model's code that branches on the batch's values (absent when it has none):
BATCH_VALUES_TAG = "batch_values_read"  # the reads of the batch's values the collection answered
UNKNOWN_VALUES_TAG = "batch_values_unknown"  # questions about values the collected batch did not have


def model_configs(model: nn.Module) -> list[Any]:
    """The Hugging Face configs in the module tree, the root's first: a wrapper's model has one too.

    A config is a module's ``config`` attribute that has any of the
    op-deciding settings (a wrapper's own ``config`` of another kind is not).
    """
    out: list[Any] = []
    for mod in model.modules():
        config = getattr(mod, "config", None)
        if config is not None and any(hasattr(config, a) for a in CONFIG_SETTINGS) and all(c is not config
                                                                                          for c in out):
            out.append(config)
    return out


def model_config(model: nn.Module) -> Any:
    """The model's Hugging Face config (the root's, else the first in the module tree), or None."""
    configs = model_configs(model)
    return configs[0] if configs else None


def switch_off_kv_cache(model: nn.Module) -> list[Any]:
    """``use_cache = False`` on every Hugging Face config in the tree; returns the configs it was on for.

    Training has no use for a KV cache, and a checkpointed layer would update
    it again when recomputed (Hugging Face's ``gradient_checkpointing_enable``
    switches it off too); the collector runs the step without one.
    """
    switched = [c for c in model_configs(model) if getattr(c, "use_cache", None)]
    for config in switched:
        config.use_cache = False
    return switched


def model_settings_of(model: nn.Module) -> dict[str, Any]:
    """What the model runs with: ``training`` and the op-deciding settings of a Hugging Face config."""
    out: dict[str, Any] = {"training": bool(model.training)}
    config = model_config(model)
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
    config = model_config(model)
    value = getattr(config, "_experts_implementation", None) if config is not None else None
    return value if isinstance(value, str) else None

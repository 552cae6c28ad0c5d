"""The settings of a model that decide which ops it runs: recorded by the collector, matched by apply_plan.

The collector writes them to ``StatsMetadata.model_settings``; applying a
plan reads them back. ``use_cache`` is switched off on the model, as
training does anyway (Hugging Face's ``gradient_checkpointing_enable`` does
the same); any other setting that differs is refused, naming it, because
the model would run other ops than the ones the plan decides for.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from estimators.moe import experts_mismatch
from planner import StatsMetadata
from estimators.plan_policy import PlanMismatchError

__all__ = ["model_settings_of", "model_dtype_name", "with_model_settings", "match_model_settings", "CONFIG_SETTINGS"]

log = logging.getLogger(__name__)

# Config attributes that change the op sequence, and the name each gets in the stats.
# (experts_implementation and the MoE routing are recorded by estimators.moe.)
CONFIG_SETTINGS = {"use_cache": "use_cache", "_attn_implementation": "attn_implementation"}
_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


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
    return _DTYPES.get(p.dtype) if p is not None else None


def with_model_settings(metadata: StatsMetadata | None, model: nn.Module) -> StatsMetadata:
    """The collector's metadata with the model's op-deciding settings (the caller's own take precedence) and,
    when the caller gave none, the dtype: called while the parameters are fake, in the dtype they ran."""
    meta = metadata or StatsMetadata(model_name=type(model).__name__)
    update: dict[str, Any] = {"model_settings": {**model_settings_of(model), **meta.model_settings}}
    if meta.dtype is None:
        update["dtype"] = model_dtype_name(model)
    return meta.model_copy(update=update)


def match_model_settings(model: nn.Module, metadata: Mapping[str, Any]) -> str:
    """Make ``model`` run as the stats' model did, or refuse; returns the likely cause of a later mismatch.

    The returned text (empty when nothing is suspect) is what a
    :class:`PlanMismatchError` says about the cause, e.g. stats collected
    for a CUDA target running on the CPU.
    """
    recorded = dict(metadata.get("model_settings") or {})
    config = getattr(model, "config", None)
    if recorded.get("use_cache") is False and getattr(config, "use_cache", None):
        config.use_cache = False
        log.info("apply_plan: set %s.config.use_cache = False, as the stats were collected (and training runs)",
                 type(model).__name__)
    current = model_settings_of(model)
    experts = experts_mismatch(model, recorded)
    if experts is not None:
        raise PlanMismatchError(f"model setting experts_implementation: {experts}")
    for key in ("attn_implementation",):
        if key in recorded and key in current and recorded[key] != current[key]:
            raise PlanMismatchError(
                f"model setting {key} is {current[key]!r} but the stats were collected with {recorded[key]!r}: "
                f"the model would run other ops; build it with {key}={recorded[key]!r} (e.g. "
                f"AutoModelForCausalLM.from_config(cfg, {key}={recorded[key]!r})) or collect the stats again")
    dtype, here = metadata.get("dtype"), model_dtype_name(model)
    if dtype in _DTYPES.values() and here is not None and here != dtype:
        raise PlanMismatchError(f"model setting dtype is {here!r} but the stats were collected with {dtype!r}: "
                                f"cast the model (model.to(torch.{_name(dtype)})) or collect the stats again")
    return _hint(model, metadata)


def _name(dtype: str) -> str:
    return {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[dtype]


def _hint(model: nn.Module, metadata: Mapping[str, Any]) -> str:
    tags = metadata.get("tags") or {}
    if (metadata.get("model_settings") or {}).get("training") is False:
        return ("the stats were collected in eval mode (no dropout, other kernels) and the plan is applied to "
                "training; fix: collect with the model in training mode (model.train())")
    p = next(iter(model.parameters()), None)
    here = p.device.type if p is not None else "cpu"
    if tags.get("attention_kernels") and here != "cuda":
        return (f"the stats were collected for a CUDA target ({metadata.get('target_device')}: attention kernels "
                f"{tags['attention_kernels']}) and this model runs on {here}, whose attention kernels differ; "
                f"fix: collect with --target-device cpu for a CPU run, or run on the target GPU")
    if metadata.get("device") and metadata.get("device") != here:
        return (f"the stats were collected on {metadata['device']} and this model runs on {here}; fix: collect "
                f"on the device the model trains on")
    return ""

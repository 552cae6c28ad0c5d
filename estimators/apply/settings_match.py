"""Matching a model to the settings its stats were collected with, before a plan applies.

``use_cache`` is switched off on the model, as training does anyway (Hugging
Face's ``gradient_checkpointing_enable`` does the same); any other setting
that differs is refused, naming it, because the model would run other ops
than the ones the plan decides for.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from torch import nn

from estimators.apply.policy import PlanMismatchError
from estimators.common import (BATCH_VALUES_TAG, DTYPE_NAMES, UNKNOWN_VALUES_TAG, experts_implementation,
                               model_dtype_name, model_settings_of, switch_off_kv_cache)

__all__ = ["experts_mismatch", "match_compile_backend", "match_model_settings", "NO_STATS_CAUSE"]

log = logging.getLogger(__name__)

NO_STATS_CAUSE = ("apply_plan was called without stats=, so the model's op-deciding settings (attn_implementation, "
                  "dtype, the collected batch's path) were not matched to the stats' and the eager ops are held to "
                  "the plan's op_names only; fix: apply_plan(model, plan, stats=stats), which also names the cause")


def match_model_settings(model: nn.Module, metadata: Mapping[str, Any] | None) -> str:
    """Make ``model`` run as the stats' model did, or refuse; returns the likely cause of a later mismatch.

    ``metadata`` is the stats' (None: ``apply_plan`` got no stats). The
    returned text (empty when nothing is suspect) is what a
    :class:`PlanMismatchError` says about the cause, e.g. stats collected
    for a CUDA target running on the CPU. Every Hugging Face config in the
    module tree counts (a wrapped model's too).
    """
    recorded = dict((metadata or {}).get("model_settings") or {})
    if recorded.get("use_cache") is not True:  # stats before issue 27 may have collected a factory's cache
        for config in switch_off_kv_cache(model):
            log.info("apply_plan: set %s use_cache = False, as sacplan collects the step and "
                     "gradient_checkpointing_enable does (a recomputed layer would update the cache again)",
                     type(config).__name__)
    if metadata is None:
        return NO_STATS_CAUSE
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
    if dtype in DTYPE_NAMES.values() and here is not None and here != dtype:
        raise PlanMismatchError(f"model setting dtype is {here!r} but the stats were collected with {dtype!r}: "
                                f"cast the model (model.to(torch.{_name(dtype)})) or collect the stats again")
    return _hint(model, metadata)


def experts_mismatch(model: nn.Module, model_settings: dict[str, Any]) -> str | None:
    """Why a plan made from stats with these ``model_settings`` cannot apply to ``model``'s experts, or None.

    The experts implementations run different op sequences, so a plan's
    decisions only fit the implementation the stats were collected with. For
    :func:`estimators.apply_plan` to call before the first step.
    """
    wanted = model_settings.get("experts_implementation")
    running = experts_implementation(model)
    if wanted is None or running is None or wanted == running:
        return None
    return (f"the stats were collected with experts_implementation {wanted!r} but {type(model).__name__} runs "
            f"{running!r}: call model.set_experts_implementation({wanted!r}) before applying the plan, or collect "
            f"the model as it is built")


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
    return _batch_values_hint(tags)


def _batch_values_hint(tags: Mapping[str, str]) -> str:
    """The cause of a mismatch in model code that branches on the batch's values, from the stats' tags."""
    if tags.get(UNKNOWN_VALUES_TAG):
        return (f"the model's code branches on the batch's values ({tags[UNKNOWN_VALUES_TAG]}) but the stats were "
                f"collected from a batch without values (made on meta), so they follow the path of a traced run, "
                f"not this batch's; fix: make the factory's inputs real tensors on the CPU, with the values of a "
                f"training batch (or --attention-mask ones|padded:F with --hf-config), and collect again")
    if tags.get(BATCH_VALUES_TAG):
        return (f"the model's code branches on the batch's values (the collection read {tags[BATCH_VALUES_TAG]}) "
                f"and this batch takes another path than the collected one (e.g. an attention mask with padding "
                f"where the collected one had none, or the reverse); fix: collect with a batch like the training "
                f"batches (--attention-mask ones|padded:F, or a factory returning such a batch), or train on "
                f"batches like the collected one")
    return ""


def match_compile_backend(model_settings: Mapping[str, Any], backend: str | None) -> str:
    """Refuse a compiled run under another backend than the stats' (naming both); log an eager-collected one.

    Returns the likely cause of a later eager mismatch ("" if none): stats
    collected with ``compile_backend`` list the ops as AOTAutograd traces
    them, which an eager run of a model with dropout does not run.
    """
    recorded = model_settings.get("compile_backend")
    if recorded is not None and backend is not None and backend != recorded:
        raise PlanMismatchError(
            f"model setting compile_backend: the run compiles with {backend!r} but the stats were collected with "
            f"compile_backend {recorded!r}: the compiled step keeps other tensors than the plan counts; compile "
            f"with backend={recorded!r} or collect again with --compile-backend {backend}")
    if recorded is None and backend in ("aot_eager", "inductor"):
        log.warning("apply_plan: the stats describe the eager step but the model runs compiled with %r: the plan's "
                    "peak does not count what the compiled step keeps (a loss computed inside the model adds a "
                    "zero gradient of its other outputs, e.g. the logits); collect with --compile-backend %s",
                    backend, backend)
    if recorded is not None and backend is None:
        return (f"the stats were collected for a step compiled with {recorded!r} (their ops are the traced ones: "
                f"native_dropout where eager runs bernoulli_) and this run is eager; fix: compile the model with "
                f"backend={recorded!r} after apply_plan(..., compile_backend={recorded!r}), or collect without "
                f"--compile-backend")
    return ""

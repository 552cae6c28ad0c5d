"""Building the model to collect: a user factory (``file.py:factory``) or a Hugging Face config.

Factory contract: a function taking any of the keyword arguments
``batch_size``, ``seq_len``, ``dtype`` (a ``torch.dtype``) and ``device`` (a
``torch.device``, ``meta`` during collection: build the model there) and
returning ``(model, inputs)``, ``(model, inputs, loss_fn)`` or ``(model,
inputs, loss_fn, optimizer_fn)``. ``inputs`` is a tensor, a tuple of
positional arguments or a dict of keyword arguments, made on the CPU with the
values of a training batch (an attention mask as the tokenizer makes it):
model code that branches on them follows their values
(:mod:`estimators.collect.input_values`); inputs made on ``device`` have no
values. ``loss_fn(output)`` returns the scalar loss (default: ``output.loss``
if present, else the sum of the first floating-point output; None too).
``optimizer_fn(params)`` builds the optimizer as training does (it is called
on the collector's fake parameters: return a new optimizer, never one built
beforehand); it replaces ``--optimizer``. Only the arguments the factory
declares are passed.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from estimators.collect.input_values import InputValues, has_value
from estimators.common import load_function

__all__ = ["ATTENTION_MASKS", "BuiltModel", "DTYPES", "attention_mask_batch", "build_from_factory",
           "build_from_hf_config", "load_factory", "parse_attention_mask"]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class BuiltModel:
    model: nn.Module
    inputs: Any
    loss_fn: Callable[[Any], torch.Tensor] | None
    name: str
    input_shape: list[int] | None
    notes: dict[str, str] = field(default_factory=dict)  # what was chosen for the user, e.g. the attention
    optimizer_fn: Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None = None


def load_factory(spec: str) -> Callable[..., Any]:
    """The function named by ``path/to/file.py:factory``."""
    return load_function(spec, "--model", what="factory")


def build_from_factory(
    factory: Callable[..., Any], *, batch_size: int, seq_len: int, dtype: torch.dtype, device: torch.device
) -> BuiltModel:
    """Call a factory with the arguments it declares and check what it returns."""
    offered = {"batch_size": batch_size, "seq_len": seq_len, "dtype": dtype, "device": device}
    params = inspect.signature(factory).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    result = factory(**{k: v for k, v in offered.items() if takes_all or k in params})
    if not isinstance(result, tuple) or len(result) not in (2, 3, 4) or not isinstance(result[0], nn.Module):
        raise ValueError(
            f"factory {getattr(factory, '__name__', factory)!r} must return (model, inputs), "
            f"(model, inputs, loss_fn) or (model, inputs, loss_fn, optimizer_fn), got {type(result).__name__}"
        )
    model, inputs = result[0], result[1]
    loss_fn = result[2] if len(result) >= 3 else None
    optimizer_fn = result[3] if len(result) == 4 else None
    if optimizer_fn is not None and (isinstance(optimizer_fn, torch.optim.Optimizer) or not callable(optimizer_fn)):
        raise ValueError(f"factory {getattr(factory, '__name__', factory)!r}: the fourth value must be "
                         f"optimizer_fn(params), a function building the optimizer (the collector calls it on fake "
                         f"parameters), got {type(optimizer_fn).__name__}")
    first = next((t for t in _flat(inputs) if isinstance(t, torch.Tensor)), None)
    shape = list(first.shape) if first is not None else None
    return BuiltModel(model, inputs, loss_fn, type(model).__name__, shape, optimizer_fn=optimizer_fn)


def _flat(inputs: Any) -> list[Any]:
    from torch.utils._pytree import tree_flatten

    return tree_flatten(inputs)[0]


def build_from_hf_config(
    config: str | Path | dict, *, batch_size: int, seq_len: int, dtype: torch.dtype, device: torch.device,
    attention_mask: str = "none",
) -> BuiltModel:
    """A causal LM from a Hugging Face config (file, hub id or dict), random weights, built on ``device`` (``meta``).

    No weights are downloaded: a hub id (``Org/Name``, where no file of that
    name exists) fetches the config alone, through ``AutoConfig`` (its cache,
    ``HF_HUB_OFFLINE``, ``HF_TOKEN`` as usual). Inputs are ``input_ids`` and
    ``labels`` of shape (batch_size, seq_len), made on the CPU with real
    values, so the model computes its own loss; ``attention_mask`` adds a mask
    as a tokenizer makes it (:func:`attention_mask_batch`: ``none``, ``ones``
    or ``padded:F``).
    """
    mask_kind, pad_fraction = parse_attention_mask(attention_mask)
    from transformers import AutoModelForCausalLM

    doc = _config_document(config)
    model_type = doc.pop("model_type", None)
    if not model_type:
        raise ValueError("--hf-config has no model_type (e.g. \"llama\")")
    _check_model_type(model_type)
    cfg = _config(model_type, doc)
    cfg.use_cache = False  # training runs without a KV cache (apply_plan switches it off on the user's model)
    notes = _pick_attention(cfg)
    with torch.device(device):
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        except AssertionError:
            # an embedding built with padding_idx out of range fails with a bare AssertionError;
            # models whose embeddings take no padding_idx (GPT-2) build fine whatever the id
            problem = _pad_token_problem(cfg, doc, model_type)
            if problem is None:
                raise
            raise ValueError(problem) from None
    model.train()
    vocab = int(getattr(cfg, "vocab_size", 32000))
    ids = torch.randint(0, vocab, (batch_size, seq_len))  # on the CPU: real values, which the collector follows
    pad = getattr(cfg, "pad_token_id", None)
    inputs = attention_mask_batch(ids, mask_kind, pad_fraction, pad if isinstance(pad, int) and pad >= 0 else 0)
    if mask_kind != "none":
        notes["attention_mask"] = attention_mask
    name = f"{model_type}-{type(model).__name__}"
    if isinstance(config, (str, Path)):
        name = str(config).rsplit("/", 1)[-1] if _is_hub_id(config) else Path(config).stem
    return BuiltModel(model, inputs, None, name, [batch_size, seq_len], notes)


ATTENTION_MASKS = ("none", "ones", "padded:F")


def parse_attention_mask(text: str) -> tuple[str, float]:
    """``none``, ``ones`` or ``padded:F`` (0 < F < 1) as (kind, padded fraction); ValueError naming the option."""
    kind, sep, rest = str(text).partition(":")
    if kind in ("none", "ones") and not sep:
        return kind, 0.0
    if kind == "padded" and sep:
        try:
            fraction = float(rest)
        except ValueError:
            fraction = -1.0
        if 0.0 < fraction < 1.0:
            return kind, fraction
    raise ValueError(f"--attention-mask must be none, ones or padded:F with 0 < F < 1 (the padded fraction of each "
                     f"row), got {text!r}")


def attention_mask_batch(ids: torch.Tensor, kind: str, pad_fraction: float, pad_id: int) -> dict[str, torch.Tensor]:
    """A batch as a tokenizer and a data collator make it: ``input_ids``, ``labels`` and the attention mask.

    ``none``: no mask; ``ones``: a mask of ones (no padding); ``padded``:
    the last ``round(F * seq)`` tokens of each row are padding (mask 0, the
    pad id, label -100), at least one token and one real token per row.
    """
    if kind == "none":
        return {"input_ids": ids, "labels": ids}
    mask = torch.ones_like(ids)
    labels = ids  # one tensor, as without a mask
    if kind == "padded":
        seq = ids.shape[-1]
        padded = min(max(1, round(pad_fraction * seq)), seq - 1)
        mask[..., seq - padded:] = 0
        ids = ids.masked_fill(mask == 0, pad_id)
        labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


# Org/Name, as the hub spells ids (huggingface_hub's rules, less their length limit); a path that exists is a file
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9]")


def _is_hub_id(config: str | Path) -> bool:
    text = str(config)
    return bool(_HUB_ID.fullmatch(text)) and not text.endswith(".json") and not Path(text).exists()


def _config_document(config: str | Path | dict) -> dict:
    """The config as a dict: read from a file, fetched from the hub (config only), or as given."""
    if not isinstance(config, (str, Path)):
        return dict(config)
    if _is_hub_id(config):
        return _hub_config(str(config))
    try:
        return json.loads(Path(config).read_text())
    except FileNotFoundError:
        raise ValueError(f"--hf-config file {str(config)!r} does not exist (a Hugging Face hub id looks like "
                         f"Org/Name)") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--hf-config file {str(config)!r} is not valid JSON: {exc}") from None


def _hub_config(repo_id: str) -> dict:
    """The hub's config.json of ``repo_id`` (no weights), through ``AutoConfig``; ValueError saying why not."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(repo_id).to_dict()
    except (OSError, ValueError) as exc:  # not found, gated, offline and not cached, no network
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"--hf-config {repo_id!r} is no file here, so it was taken as a Hugging Face hub id, and its "
                         f"config could not be fetched: {reason[:300]} (offline? HF_HUB_OFFLINE=1 reads only the "
                         f"local cache; or save the config.json and give its path)") from None


def _config(model_type: str, doc: dict) -> Any:
    """``AutoConfig.for_model``, its validation errors (hidden size not a multiple of the heads, ...) as ValueError."""
    from transformers import AutoConfig

    try:
        return AutoConfig.for_model(model_type, **doc)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"--hf-config is not a valid {model_type} config: {exc}") from None
    except Exception as exc:  # huggingface_hub's StrictDataclass errors are no ValueError; the cause says why
        if not type(exc).__module__.startswith("huggingface_hub"):
            raise
        cause = exc.__cause__ or exc
        raise ValueError(f"--hf-config is not a valid {model_type} config: {str(cause).strip()}") from None


def _pick_attention(cfg: Any) -> dict[str, str]:
    """SDPA unless the config names an implementation or the model class does not support it (gemma2)."""
    if getattr(cfg, "_attn_implementation_internal", None) is not None:
        return {}
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    cls = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(cfg), None)
    if cls is not None and not getattr(cls, "_supports_sdpa", True):
        return {"attention": f"the model's own ({cls.__name__} does not support sdpa)"}
    cfg._attn_implementation = "sdpa"  # layout: allow-private (a config's attention kernel, transformers' way)
    return {}


def _check_model_type(model_type: Any) -> None:
    """A short error naming the closest model types, not transformers' list of every one (~9,000 characters)."""
    import difflib

    import transformers
    from transformers import CONFIG_MAPPING

    known = list(CONFIG_MAPPING.keys())
    if model_type in known:
        return
    close = difflib.get_close_matches(str(model_type), known, n=5, cutoff=0.6)
    hint = f"closest: {', '.join(close)}" if close else "no close name"
    raise ValueError(f"--hf-config model_type {model_type!r} is not a model type of transformers "
                     f"{transformers.__version__} ({hint}; {len(known)} types in all)")


def _pad_token_problem(cfg: Any, doc: dict, model_type: str) -> str | None:
    """Why the config's pad_token_id cannot be an embedding's padding_idx, or None."""
    pad, vocab = getattr(cfg, "pad_token_id", None), getattr(cfg, "vocab_size", None)
    if isinstance(pad, int) and isinstance(vocab, int) and not -vocab <= pad < vocab:
        origin = "" if "pad_token_id" in doc else f" (the {model_type} default; the file does not set it)"
        return (f"--hf-config pad_token_id {pad}{origin} is outside the vocabulary (vocab_size {vocab}): "
                f"set \"pad_token_id\" to null or an id below {vocab}")
    return None


def hf_fake_as_real(model: nn.Module, values: InputValues | None = None) -> Any:
    """A context under which a Hugging Face model takes the same mask path on fake tensors as on real ones.

    ``transformers.masking_utils`` treats any fake tensor as tracing and then
    materializes the causal mask, so SDPA gets an ``attn_mask`` and, with
    grouped-query attention, HF repeats key/value heads itself; on real
    tensors it passes ``is_causal=True`` and ``enable_gqa`` instead. The op
    sequences then differ and a plan made from fake stats would not apply.

    So under fakes: a fake tensor with a value (the batch's attention mask,
    and what derives from it: :mod:`estimators.collect.input_values`) is not
    tracing, and its values decide as in the real run (an all-ones mask is
    dropped, a padded one kept); so is the scalar offset check. Position ids
    the model makes itself are taken to hold one sequence per row (no
    packing), which is what an unpacked real run finds; position ids from
    the batch are read. A padding mask without values (made on ``meta``)
    still counts as tracing. What remains different: the real run's packing
    check on the model's own position ids reads a value (``select``, ``eq``,
    ``all``, ``_local_scalar_dense`` in the base model's own ops, outside
    the decoder layers), so only the root and base-model op lists differ by
    those ops. Any Hugging Face module in the tree switches this on, whatever
    the root is (a wrapper, a Lightning-style module, a custom head).
    A mask without values that the model asks about is noted in ``values.unknown``.
    """
    from contextlib import ExitStack, nullcontext
    from unittest import mock

    mu = _masking_utils(model)
    if mu is None or not hasattr(mu, "is_tracing"):
        return nullcontext()
    from torch._subclasses.fake_tensor import is_fake

    original = mu.is_tracing

    def is_tracing(tensor: Any = None) -> bool:
        if isinstance(tensor, torch.Tensor) and is_fake(tensor) and (tensor.numel() <= 1 or has_value(tensor)):
            return original(None)
        if values is not None and isinstance(tensor, torch.Tensor) and is_fake(tensor):
            values.unknown.append("transformers is_tracing")
        return original(tensor) if tensor is not None else original()

    stack = ExitStack()
    stack.enter_context(mock.patch.object(mu, "is_tracing", is_tracing))
    find_packed = getattr(mu, "find_packed_sequence_indices", None)
    if find_packed is not None:

        def unpacked(position_ids: torch.Tensor) -> Any:
            if not is_fake(position_ids) or has_value(position_ids, from_batch=True):
                return find_packed(position_ids)
            with mock.patch.object(mu, "is_tracing", lambda tensor=None: True):
                find_packed(position_ids)  # the same ops as a real run, up to reading the values
            return None

        stack.enter_context(mock.patch.object(mu, "find_packed_sequence_indices", unpacked))
    return stack


def _masking_utils(model: nn.Module) -> Any:
    import sys

    # any class of any module's: a wrapper holds the HF model; fully_shard subclasses it (FSDPLlamaForCausalLM)
    hf = any(c.__module__.startswith("transformers.") for m in model.modules() for c in type(m).__mro__)
    if not hf or "transformers.masking_utils" not in sys.modules:
        return None
    return sys.modules["transformers.masking_utils"]

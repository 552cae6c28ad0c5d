"""An error raised inside the model's step, told with the module that raised it and the config's shape fields.

A config whose shapes do not fit together (5 attention heads over 2
key/value heads) fails deep in an op: "Number of heads in key and value must
divide the number of heads in query", with no module or field named. The
traceback still holds the frames of every module running (``self`` of their
``forward``): the outermost is the model, the innermost the module to name.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from torch import nn

__all__ = ["explain_step_error", "SHAPE_FIELDS"]

# config fields that set tensor shapes, as Hugging Face's configs name them
SHAPE_FIELDS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                "vocab_size", "num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                "n_embd", "n_head", "d_model", "num_heads")


def explain_step_error(exc: BaseException) -> str | None:
    """The module running when ``exc`` was raised and the model config's shape fields; None outside a model."""
    modules = _modules_running(exc.__traceback__)
    if not modules:
        return None
    root, inner = modules[0], modules[-1]
    name = next((n for n, m in root.named_modules() if m is inner), None)
    where = type(root).__name__ + (f".{name}" if name else "")
    message = " ".join(str(exc).split())[:400] or type(exc).__name__
    text = f"in module {where} ({type(inner).__name__}): {message}"
    fields = _shape_fields(getattr(root, "config", None))
    if fields:
        text += f"; the config's shape fields: {fields} (do they divide as the model needs?)"
    return text


def _modules_running(tb: TracebackType | None) -> list[nn.Module]:
    """The modules whose code is on the traceback, outermost first, each once."""
    out: list[nn.Module] = []
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and (not out or out[-1] is not owner):
            out.append(owner)
        tb = tb.tb_next
    return out


def _shape_fields(config: Any) -> str:
    if config is None:
        return ""
    shown = [(k, getattr(config, k)) for k in SHAPE_FIELDS if getattr(config, k, None) is not None]
    return ", ".join(f"{k}={v}" for k, v in shown)

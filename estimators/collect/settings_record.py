"""What the collector records of the model's op-deciding settings, in the stats' metadata."""

from __future__ import annotations

from typing import Any

from torch import nn

from estimators.common import model_dtype_name, model_settings_of
from planner import StatsMetadata

__all__ = ["with_model_settings"]


def with_model_settings(metadata: StatsMetadata | None, model: nn.Module) -> StatsMetadata:
    """The collector's metadata with the model's op-deciding settings (the caller's own take precedence) and,
    when the caller gave none, the dtype: called while the parameters are fake, in the dtype they ran."""
    meta = metadata or StatsMetadata(model_name=type(model).__name__)
    update: dict[str, Any] = {"model_settings": {**model_settings_of(model), **meta.model_settings}}
    if meta.dtype is None:
        update["dtype"] = model_dtype_name(model)
    return meta.model_copy(update=update)

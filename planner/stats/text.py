"""Text fields of the stats format: any string that encodes as UTF-8."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator

__all__ = ["Text"]


def _unicode_text(v: str) -> str:
    """Text must encode as UTF-8: JSON can carry a lone surrogate ("\\ud800"), which is no character."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"must be valid Unicode text, got a lone surrogate at character {exc.start}") from None
    return v


Text = Annotated[str, AfterValidator(_unicode_text)]

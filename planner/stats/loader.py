"""Load stats documents: our v1 format, or PyTorch's (``module_info`` + ``sac_stats``)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.stats.format import Stats, short_value
from planner.stats.torch_format import from_torch_format, is_torch_format

__all__ = ["StatsError", "load_stats", "parse_stats", "from_torch_format", "is_torch_format"]


class StatsError(ValueError):
    """A stats document that cannot be used, with the field and value named."""

    def __init__(self, message: str, errors: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.errors = errors or [{"loc": _loc_of(message), "msg": message}]


def parse_stats(doc: Any) -> Stats:
    """Validate a decoded JSON document in either format; raise StatsError naming the problem."""
    if isinstance(doc, Stats):
        return doc
    if _is_plan(doc):
        what = ("a list of plans (what sacplan sweep --json answers)" if isinstance(doc, list)
                else "a plan (what sacplan plan --json answers)")
        raise StatsError(f"this is {what}, not stats: give the stats the plan was made from (what sacplan "
                         "collect wrote, or PyTorch's module_info + sac_stats)")
    if not isinstance(doc, Mapping):
        raise StatsError(f"stats document must be a JSON object, got {type(doc).__name__}")
    try:
        if is_torch_format(doc):
            return from_torch_format(doc)
        return Stats.model_validate(doc)
    except ValidationError as exc:
        raise StatsError(_describe(exc), _errors(exc)) from None
    except ValueError as exc:  # whole-document checks, and PyTorch-format conversion
        if isinstance(exc, StatsError):
            raise
        raise StatsError(str(exc)) from None


def load_stats(path: str | Path) -> Stats:
    """Read and validate a stats file (v1 or PyTorch's format)."""
    p = Path(path)
    name = str(p)
    try:
        text = p.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise StatsError(f"stats file {name!r} does not exist") from None
    except IsADirectoryError:
        raise StatsError(f"stats file {name!r} is a directory, not a JSON file") from None
    except UnicodeDecodeError as exc:
        raise StatsError(f"stats file {name!r} is not UTF-8 text (byte {exc.start}): not a JSON stats file") from None
    except OSError as exc:
        raise StatsError(f"stats file {name!r} cannot be read: {exc.strerror or exc}") from None
    if not text.strip():
        raise StatsError(f"stats file {name!r} is empty")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StatsError(f"stats file {name!r} is not valid JSON: {exc}") from None
    except RecursionError:
        raise StatsError(f"stats file {name!r} nests too deeply to be a stats document") from None
    return parse_stats(doc)


_PLAN_KEYS = frozenset({"status", "memory_budget_gib", "planner_version", "baseline_peak_bytes"})


def _is_plan(doc: Any) -> bool:
    """A plan, or a sweep's list of plans, and no stats document (which has neither these keys nor a list)."""
    if isinstance(doc, list) and doc:
        doc = doc[0]
    return isinstance(doc, Mapping) and _PLAN_KEYS <= doc.keys() and "metadata" not in doc


def _errors(exc: ValidationError) -> list[dict[str, Any]]:
    out = []
    for e in exc.errors(include_url=False):
        loc = [str(x) for x in e["loc"]] or _loc_of(e["msg"].removeprefix("Value error, "))
        out.append({"loc": loc, "msg": e["msg"], "input": short_value(e.get("input"))})
    return out


_LEADING_PATH = re.compile(r"([A-Za-z_]\w*(?:\[\d+\])*)(?:\.([A-Za-z_]\w*(?:\[\d+\])*))*")


def _loc_of(msg: str) -> list[str]:
    """The field a whole-document check names first ('modules[4].held_inputs ...' -> modules, 4, held_inputs),
    so every error has a location; the document as a whole ("body" of the upload) when it names none."""
    m = _LEADING_PATH.match(msg)
    if m is None or not re.match(r"\w+\[\d+\]", msg) and "." not in m.group(0):
        return ["body"]
    return [x for part in m.group(0).split(".") for x in re.findall(r"[A-Za-z_]\w*|\d+", part)]


def _describe(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors(include_url=False)[:5]:
        loc = _path(e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if loc and e["type"] == "missing":
            parts.append(f"{loc}: field required")
        elif loc and e["type"] not in ("value_error",):
            parts.append(f"{loc}: {msg} (got {short_value(e.get('input'))!r})")
        elif loc:
            parts.append(f"{loc}: {msg}")
        else:
            parts.append(msg)
    more = exc.error_count() - 5
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        part = part if isinstance(part, int) else short_value(str(part))
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out

"""Load stats documents: our v1 format, or PyTorch's (``module_info`` + ``sac_stats``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.op_policy import ops_from_torch
from planner.stats import STATS_FORMAT, Stats

__all__ = ["StatsError", "load_stats", "parse_stats", "from_torch_format", "is_torch_format"]


class StatsError(ValueError):
    """A stats document that cannot be used, with the field and value named."""

    def __init__(self, message: str, errors: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.errors = errors or [{"loc": [], "msg": message}]


def is_torch_format(doc: Mapping[str, Any]) -> bool:
    return isinstance(doc, Mapping) and "module_info" in doc and "format" not in doc


def parse_stats(doc: Any) -> Stats:
    """Validate a decoded JSON document in either format; raise StatsError naming the problem."""
    if isinstance(doc, Stats):
        return doc
    if not isinstance(doc, Mapping):
        raise StatsError(f"stats document must be a JSON object, got {type(doc).__name__}")
    try:
        if is_torch_format(doc):
            return from_torch_format(doc)
        return Stats.model_validate(doc)
    except ValidationError as exc:
        raise StatsError(_describe(exc), _errors(exc)) from None
    except (ValueError, TypeError, KeyError) as exc:
        if isinstance(exc, StatsError):
            raise
        msg = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise StatsError(msg) from None


def load_stats(path: str | Path) -> Stats:
    """Read and validate a stats file (v1 or PyTorch's format)."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise StatsError(f"stats file {str(p)!r} does not exist") from None
    except json.JSONDecodeError as exc:
        raise StatsError(f"stats file {str(p)!r} is not valid JSON: {exc}") from None
    return parse_stats(doc)


def _errors(exc: ValidationError) -> list[dict[str, Any]]:
    out = []
    for e in exc.errors(include_url=False):
        out.append({"loc": [str(x) for x in e["loc"]], "msg": e["msg"], "input": _short(e.get("input"))})
    return out


def _short(v: Any) -> Any:
    if isinstance(v, (dict, list)):
        return f"<{type(v).__name__} of {len(v)}>"
    if isinstance(v, str) and len(v) > 80:
        return v[:77] + "..."
    return v


def _describe(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors(include_url=False)[:5]:
        loc = _path(e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if loc and e["type"] == "missing":
            parts.append(f"{loc}: field required")
        elif loc and e["type"] not in ("value_error",):
            parts.append(f"{loc}: {msg} (got {_short(e.get('input'))!r})")
        elif loc:
            parts.append(f"{loc}: {msg}")
        else:
            parts.append(msg)
    more = exc.error_count() - 5
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_TORCH_FIELDS = {
    "param_bytes": "param_per_module",
    "grad_bytes": "grad_per_module",
    "act_saved_bytes": "act_fw_per_module",
    "act_total_bytes": "act_total",
    "act_grad_bytes": "act_grad_per_module",
    "act_bw_bytes": "act_bw_per_module",
    "grad_total_bytes": "grad_total",
    "input_bytes": "input_per_module",
    "output_bytes": "output_per_module",
    "fw_ms": "fw_runtime_per_module",
    "bw_ms": "bw_runtime_per_module",
}


def from_torch_format(doc: Mapping[str, Any]) -> Stats:
    """Convert PyTorch's ``ModuleInfo`` + per-module ``SACStats`` into stats v1.

    Every figure the planner uses carries over unchanged; PyTorch's fitted
    curve fields (``slopes``, ``tradeoff_curve``, ...) are dropped because an
    exact planner does not need them.
    """
    info = doc["module_info"]
    if not isinstance(info, Mapping):
        raise StatsError("module_info must be an object")
    order = info["mod_order"]
    mod_stats = info["mod_stats"]
    sac = doc.get("sac_stats") or {}
    if not isinstance(mod_stats, list) or not isinstance(sac, Mapping):
        raise StatsError("module_info.mod_stats must be a list and sac_stats an object")
    fqns = set()
    for k, ms in enumerate(mod_stats):
        if not isinstance(ms, Mapping) or not isinstance(ms.get("fqn"), str):
            raise StatsError(f"module_info.mod_stats[{k}].fqn is missing")
        fqns.add(ms["fqn"])
    unknown = [f for f in sac if f not in fqns]
    if unknown:
        raise StatsError(f"sac_stats[{unknown[0]!r}] names no module in module_info.mod_stats")

    modules = []
    for k, ms in enumerate(mod_stats):
        fqn = ms["fqn"]
        m: dict[str, Any] = {"fqn": fqn, "parent": _parent(fqn, fqns), "is_leaf": bool(ms.get("is_leaf", False))}
        for ours, theirs in _TORCH_FIELDS.items():
            if theirs in ms and ms[theirs] is not None:
                v = ms[theirs]
                m[ours] = v
        if fqn in sac:
            try:
                ops, fsr = ops_from_torch(sac[fqn])
            except (ValueError, TypeError, KeyError) as exc:
                raise StatsError(f"sac_stats[{fqn!r}]: {exc}") from None
            m["ops"] = ops
            m["force_store_random"] = fsr
        modules.append(m)

    model = doc.get("model")
    meta: dict[str, Any] = {
        "model_name": str(model) if model else "unknown",
        "tags": {"source_format": "torch"},
    }
    return Stats.model_validate(
        {
            "format": STATS_FORMAT,
            "metadata": meta,
            "fw_pre_order": list(order["fw_pre_order"]),
            "fw_post_order": list(order["fw_post_order"]),
            "modules": modules,
        }
    )


def _parent(fqn: str, fqns: set[str]) -> str | None:
    """Longest proper dotted prefix of ``fqn`` that is itself a module."""
    parts = fqn.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        cand = ".".join(parts[:cut])
        if cand in fqns:
            return cand
    return None

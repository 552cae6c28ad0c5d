"""The limits that are settings, not constants in the schemas: enforced on each request and
written into the OpenAPI document, so the documented maximum is the enforced one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.config import Settings
from service.errors import InvalidInput, PayloadTooLarge

__all__ = ["MIN_TIME_LIMIT_S", "check_time_limit", "document_limits", "UploadLimits", "check_upload"]

# Less than a solve can use: handing a job to a solver process and reading its answer back alone takes longer.
# Below it a request was solved anyway (the solver's own floor) and stored as if the limit had been met.
MIN_TIME_LIMIT_S = 0.01


def check_time_limit(time_limit_s: float, max_time_limit_s: float) -> None:
    """Refuse (422, naming the field) a ``time_limit_s`` outside ``MIN_TIME_LIMIT_S`` .. ``max_time_limit_s``."""
    if time_limit_s > max_time_limit_s:
        message = f"time_limit_s {time_limit_s} is above this service's maximum {max_time_limit_s}"
    elif time_limit_s < MIN_TIME_LIMIT_S:
        message = (f"time_limit_s {time_limit_s} is below this service's minimum {MIN_TIME_LIMIT_S}: "
                   f"less than any solve can use")
    else:
        return
    raise InvalidInput(message, errors=[{"loc": ["body", "time_limit_s"], "msg": message, "input": time_limit_s}])


def document_limits(schema: dict[str, Any], settings: Settings) -> None:
    """Write the limits that are settings into the OpenAPI document ``schema``."""
    schemas = schema.get("components", {}).get("schemas", {})
    for name in ("PlanRequest", "SweepRequest"):
        field = schemas.get(name, {}).get("properties", {}).get("time_limit_s")
        if field is not None:
            field["maximum"] = settings.max_time_limit_s
            field.pop("exclusiveMinimum", None)
            field["minimum"] = MIN_TIME_LIMIT_S


@dataclass(frozen=True)
class UploadLimits:
    """How big a stats document may be: modules, ops (all modules) and module nesting depth (the root is 1)."""

    modules: int
    ops: int
    depth: int

    @classmethod
    def of(cls, settings: Settings) -> UploadLimits:
        return cls(settings.max_upload_modules, settings.max_upload_ops, settings.max_upload_depth)


def check_upload(doc: Any, limits: UploadLimits, loc: Sequence[str] = ()) -> int:
    """Refuse (413, naming the limit and the value) a stats document past ``limits``, before it is validated.

    Counts what the document says in either format; a document too malformed to
    count is left to the validation that follows. Returns its modules + ops.
    """
    if not isinstance(doc, dict):
        return 0
    info, sac = doc.get("module_info"), doc.get("sac_stats")
    if isinstance(info, dict) and isinstance(sac, dict):  # PyTorch's format: fqns are the tree
        modules = info.get("mod_stats")
        module_count = len(modules) if isinstance(modules, list) else 0
        op_count = sum(len(s.get("func_names") or ()) for s in sac.values() if isinstance(s, dict))
        names = [m.get("fqn") for m in modules if isinstance(m, dict)] if isinstance(modules, list) else []
        depth = max((n.count(".") + 1 for n in names if isinstance(n, str)), default=0)
        depth_shown = str(depth)
        where = "module_info.mod_stats"
    else:
        modules = doc.get("modules")
        if not isinstance(modules, list):
            return 0
        module_count = len(modules)
        op_count = sum(len(m["ops"]) for m in modules if isinstance(m, dict) and isinstance(m.get("ops"), list))
        depth = _tree_depth(modules, limits.depth)  # counted only up to one past the limit
        depth_shown = f"more than {limits.depth}"
        where = "modules"
    _refuse_over(module_count, limits.modules, "modules", "SACPLAN_MAX_UPLOAD_MODULES", [*loc, where])
    _refuse_over(op_count, limits.ops, "ops", "SACPLAN_MAX_UPLOAD_OPS", [*loc, where])
    _refuse_over(depth, limits.depth, "levels of module nesting", "SACPLAN_MAX_UPLOAD_DEPTH", [*loc, where],
                 shown=depth_shown)
    return module_count + op_count


def _refuse_over(value: int, limit: int, what: str, setting: str, loc: list[str], shown: str | None = None) -> None:
    if value > limit:
        message = f"the stats have {shown or value} {what}; this service's limit is {limit} ({setting})"
        raise PayloadTooLarge(message, errors=[{"loc": loc, "msg": message, "input": value}])


def _tree_depth(modules: list[Any], limit: int) -> int:
    """Depth of the deepest module by ``parent`` links, at most ``limit + 1`` (enough to refuse)."""
    parent = {m.get("fqn"): m.get("parent") for m in modules if isinstance(m, dict) and isinstance(m.get("fqn"), str)}
    depth: dict[str, int] = {}
    deepest = 0
    for fqn in parent:
        chain: list[str] = []
        node: Any = fqn
        while isinstance(node, str) and node in parent and node not in depth and len(chain) <= limit:
            if node in chain:  # a cycle: the validation says so
                return 0
            chain.append(node)
            node = parent[node]
        below = depth.get(node, 0) if isinstance(node, str) else 0
        for k, name in enumerate(reversed(chain)):
            depth[name] = below + k + 1
        deepest = max(deepest, depth.get(fqn, below + len(chain)))
        if deepest > limit:
            return limit + 1
    return deepest

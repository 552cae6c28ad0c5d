"""PyTorch interop: ``ModuleInfo`` + per-module ``SACStats`` (torch.distributed._tools) to stats v1.

Every figure the planner uses carries over unchanged; PyTorch's fitted curve
fields (``slopes``, ``tradeoff_curve``, ...) are dropped because an exact
planner does not need them. Errors name the field in PyTorch's terms
(``module_info.mod_stats[3].act_total``, ``sac_stats['layers.0'].runtimes[2]``)
with the value, so the user can find it in the file they wrote.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from planner.stats.format import STATS_FORMAT, OpStats, Stats, short_value
from planner.stats.op_format import OP_FIELDS, CompactOps
from planner.stats.orders import innermost_prefix_module

__all__ = ["TORCH_MODULE_FIELDS", "from_torch_format", "is_torch_format", "ops_from_torch"]

# stats v1 field -> PyTorch ModStats field
TORCH_MODULE_FIELDS = {
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
# ModStats fields the planner reads: PyTorch always writes them, so a missing one is an error, not a 0
_REQUIRED = ("param_per_module", "act_fw_per_module", "act_total", "act_grad_per_module", "grad_total",
             "fw_runtime_per_module", "bw_runtime_per_module", "is_leaf")
# OpStats field -> the SACStats list holding it
_TORCH_OP_FIELDS = {"name": "func_names", "runtime_ms": "runtimes", "output_bytes": "memory"}


def is_torch_format(doc: Any) -> bool:
    """Whether a decoded document is PyTorch's format (``module_info``, no ``format`` key)."""
    return isinstance(doc, Mapping) and "module_info" in doc and "format" not in doc


def ops_from_torch(sac_stats: Any, maker: CompactOps | None = None) -> tuple[list[OpStats], bool]:
    """Convert PyTorch's ``SACStats`` (object or dict) to our op list and its ``force_store_random``.

    ``maker`` makes the ops (one per document shares their names); raises ValueError naming the SACStats field
    and value (``runtimes[2] ...``).
    """
    if isinstance(sac_stats, Mapping):
        get = sac_stats.get
    elif hasattr(sac_stats, "func_names"):
        get = lambda k, d=None: getattr(sac_stats, k, d)  # noqa: E731
    else:
        raise ValueError(f"must be an object with func_names, runtimes and memory, got {type(sac_stats).__name__}")
    names = _list(get, "func_names", required=True)
    n = len(names)
    runtimes = _list(get, "runtimes", required=True)
    memory = _list(get, "memory", required=True)
    for field, values in (("runtimes", runtimes), ("memory", memory)):
        if len(values) != n:
            raise ValueError(f"{field} has {len(values)} entries but func_names has {n}")
    views = set(_indices("view_like_ops", _list(get, "view_like_ops"), n))
    rands = set(_indices("rand_ops", _list(get, "rand_ops"), n))
    saved = set(_indices("saved_autograd_ops", _list(get, "saved_autograd_ops"), n))
    parent = _inplace_parents(_list(get, "inplace_ops"), n)
    fsr = get("force_store_random", False)
    if not isinstance(fsr, bool):
        raise ValueError(f"force_store_random must be true or false, got {fsr!r}")
    make = (maker or CompactOps()).op
    ops = []
    for i in range(n):
        fields = (names[i], runtimes[i], memory[i], i in views, i in rands, parent.get(i), i in saved)
        if (op := make(*fields)) is not None:
            ops.append(op)
            continue
        try:  # a value the compact path leaves to the model: it converts it, or says what is wrong
            ops.append(OpStats(**dict(zip(OP_FIELDS, fields))))
        except ValidationError as exc:
            e = exc.errors(include_url=False)[0]
            field = _TORCH_OP_FIELDS.get(str(e["loc"][0]) if e["loc"] else "", "op")
            if e["type"] == "value_error":  # our own check's message already quotes the value
                raise ValueError(f"{field}[{i}]: {e['msg'].removeprefix('Value error, ')}") from None
            raise ValueError(f"{field}[{i}]: {e['msg']} (got {e.get('input')!r})") from None
    return ops, fsr


def _list(get, field: str, *, required: bool = False) -> Sequence[Any]:
    v = get(field, None)
    if v is None:
        if required:
            raise ValueError(f"{field} is missing")
        return []
    if isinstance(v, Sequence) and not isinstance(v, (str, bytes)):
        return v
    if not isinstance(v, (str, bytes, Mapping)) and hasattr(v, "__iter__"):
        return list(v)  # an array-like in a real SACStats
    raise ValueError(f"{field} must be a list, got {type(v).__name__} {short_value(v)!r}")


def _index(v: Any) -> int | None:
    """An op index as an int, or None if ``v`` is not a whole number."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if hasattr(v, "__index__"):  # numpy integers
        return int(v.__index__())
    return None


def _op_index(where: str, v: Any, n: int) -> int:
    i = _index(v)
    if i is None:
        raise ValueError(f"{where} {short_value(v)!r} is not a whole-number op index")
    if not 0 <= i < n:
        raise ValueError(f"{where} {v!r} is out of range for {n} ops")
    return i


def _indices(field: str, values: Sequence[Any], n: int) -> list[int]:
    return [_op_index(f"{field}[{k}]", v, n) for k, v in enumerate(values)]


def _inplace_parents(pairs: Sequence[Any], n: int) -> dict[int, int]:
    parent: dict[int, int] = {}
    for k, pair in enumerate(pairs):
        if isinstance(pair, (str, bytes, Mapping)) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise ValueError(f"inplace_ops[{k}] {short_value(pair)!r} is not an [op, parent] pair")
        op, par = _op_index(f"inplace_ops[{k}] op", pair[0], n), _op_index(f"inplace_ops[{k}] parent", pair[1], n)
        if op in parent and parent[op] != par:
            raise ValueError(f"inplace_ops[{k}] gives op {op} the parent {par}, but an earlier entry gave it "
                             f"{parent[op]}")
        parent[op] = par
    return parent


def from_torch_format(doc: Mapping[str, Any]) -> Stats:
    """Convert PyTorch's ``ModuleInfo`` + per-module ``SACStats`` into stats v1.

    Raises ValueError naming the field in PyTorch's terms and its value.
    """
    info = _object(doc, "module_info", "module_info")
    order = _object(info, "mod_order", "module_info.mod_order")
    orders = {}
    for name in ("fw_pre_order", "fw_post_order"):
        lst = order.get(name)
        if not isinstance(lst, list):
            raise ValueError(f"module_info.mod_order.{name} must be a list of module fqns, got {short_value(lst)!r}")
        orders[name] = lst
    mod_stats = info.get("mod_stats")
    if not isinstance(mod_stats, list):
        raise ValueError(f"module_info.mod_stats must be a list, got {short_value(mod_stats)!r}")
    sac = doc.get("sac_stats")
    if sac is None:
        sac = {}
    if not isinstance(sac, Mapping):
        raise ValueError(f"sac_stats must be an object mapping module fqns to SACStats, got {short_value(sac)!r}")
    fqns: dict[str, int] = {}
    for k, ms in enumerate(mod_stats):
        if not isinstance(ms, Mapping) or not isinstance(ms.get("fqn"), str):
            raise ValueError(f"module_info.mod_stats[{k}].fqn is missing")
        fqns.setdefault(ms["fqn"], k)
    unknown = [f for f in sac if f not in fqns]
    if unknown:
        raise ValueError(f"sac_stats[{unknown[0]!r}] names no module in module_info.mod_stats")

    maker = CompactOps()
    modules = [_module(k, ms, fqns, sac, maker) for k, ms in enumerate(mod_stats)]
    model = doc.get("model")
    v1 = {
        "format": STATS_FORMAT,
        "metadata": {"model_name": str(model) if model else "unknown", "tags": {"source_format": "torch"}},
        "fw_pre_order": orders["fw_pre_order"],
        "fw_post_order": orders["fw_post_order"],
        "modules": modules,
    }
    try:
        return Stats.model_validate(v1)
    except ValidationError as exc:
        names = [m["fqn"] for m in modules]
        raise ValueError("; ".join(_torch_error(e, names) for e in exc.errors(include_url=False)[:5])) from None


def _object(doc: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    v = doc.get(key)
    if not isinstance(v, Mapping):
        raise ValueError(f"{where} must be an object, got {short_value(v)!r}" if v is not None else f"{where} is missing")
    return v


def _module(k: int, ms: Mapping[str, Any], fqns: dict[str, int], sac: Mapping[str, Any],
            maker: CompactOps) -> dict[str, Any]:
    fqn = ms["fqn"]
    missing = [f for f in _REQUIRED if ms.get(f) is None]
    if missing:
        raise ValueError(f"module_info.mod_stats[{k}] ({fqn!r}).{missing[0]}: field required"
                         + (f" (also missing: {', '.join(missing[1:])})" if len(missing) > 1 else ""))
    is_leaf = ms["is_leaf"]
    if not isinstance(is_leaf, bool):
        raise ValueError(f"module_info.mod_stats[{k}].is_leaf must be true or false, got {is_leaf!r}")
    m: dict[str, Any] = {"fqn": fqn, "parent": innermost_prefix_module(fqn, fqns), "is_leaf": is_leaf}
    for ours, theirs in TORCH_MODULE_FIELDS.items():
        v = ms.get(theirs)
        if v is not None:
            m[ours] = v
    if fqn in sac:
        if not isinstance(sac[fqn], Mapping):
            raise ValueError(f"sac_stats[{fqn!r}] must be an object (PyTorch's SACStats as a dict), "
                             f"got {type(sac[fqn]).__name__}")
        try:
            m["ops"], m["force_store_random"] = ops_from_torch(sac[fqn], maker)
        except ValueError as exc:
            raise ValueError(f"sac_stats[{fqn!r}].{exc}") from None
    return m


def _torch_error(e: Mapping[str, Any], names: list[str]) -> str:
    """One pydantic error of the converted document, told in PyTorch's field names."""
    loc, msg = tuple(e["loc"]), e["msg"].removeprefix("Value error, ")
    if not loc:  # a whole-document check: its message names v1 paths
        return _torch_paths(msg, names)
    where = _torch_loc(loc, names)
    if e["type"] == "missing":
        return f"{where}: field required"
    if e["type"] == "value_error":
        return f"{where}: {msg}"
    return f"{where}: {msg} (got {short_value(e.get('input'))!r})"


def _torch_loc(loc: tuple[Any, ...], names: list[str]) -> str:
    if loc[0] == "modules" and len(loc) >= 3 and isinstance(loc[1], int):
        k, field = loc[1], loc[2]
        if field == "ops" and len(loc) >= 5:
            return f"sac_stats[{names[k]!r}].{_TORCH_OP_FIELDS.get(loc[4], loc[4])}[{loc[3]}]"
        return f"module_info.mod_stats[{k}].{TORCH_MODULE_FIELDS.get(field, field)}"
    if loc[0] in ("fw_pre_order", "fw_post_order"):
        return f"module_info.mod_order.{loc[0]}" + "".join(f"[{x}]" for x in loc[1:])
    return ".".join(str(x) for x in loc)


def _torch_paths(msg: str, names: list[str]) -> str:
    """A v1 validation message with its paths rewritten to PyTorch's."""
    def ops(m: re.Match) -> str:
        return f"sac_stats[{names[int(m.group(1))]!r}]" + (f" op {m.group(2)}" if m.group(2) else "")

    msg = msg.replace("op lists belong to non-leaf modules (give null)",
                      "SACStats belong to non-leaf modules (drop this entry)")
    msg = re.sub(r"modules\[(\d+)\]\.ops\[(\d+)\]\.inplace_parent (\d+)",
                 lambda m: f"sac_stats[{names[int(m.group(1))]!r}].inplace_ops: op {m.group(2)}'s parent {m.group(3)}",
                 msg)
    msg = re.sub(r"modules\[(\d+)\]\.ops(?:\[(\d+)\])?", ops, msg)
    msg = re.sub(r"modules\[(\d+)\]", r"module_info.mod_stats[\1]", msg)
    return re.sub(r"(?<![\w.])(fw_pre_order|fw_post_order)", r"module_info.mod_order.\1", msg)

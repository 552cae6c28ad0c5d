"""The stats formats in the OpenAPI document, so Swagger UI and ReDoc show their fields.

The routes take a stats document as a plain JSON object (a body over a MiB is
validated in a render process, off the event loop; smaller ones by the
planner in the route): what a document may hold is declared here, in the
document only. Stats v1 is ``planner.Stats``'s own JSON Schema (what
``sacplan schema`` prints); PyTorch's format (``module_info`` + ``sac_stats``
of ``torch.distributed._tools``) is written from the fields the planner
reads of it (``planner.stats.torch_format``).
"""

from __future__ import annotations

from typing import Any

import planner
from planner.stats.torch_format import TORCH_MODULE_FIELDS

__all__ = ["STATS_DOCUMENT", "declare_stats_formats"]

STATS_DOCUMENT = "StatsDocument"
_REF = "#/components/schemas/{model}"
# The ModStats fields PyTorch always writes (a missing one is refused, not taken as 0).
_TORCH_REQUIRED = ["fqn", "is_leaf", "param_per_module", "act_fw_per_module", "act_total", "act_grad_per_module",
                   "grad_total", "fw_runtime_per_module", "bw_runtime_per_module"]


def _torch_module() -> dict[str, Any]:
    ours = planner.Stats.model_json_schema()["$defs"]["ModuleStats"]["properties"]
    fields = {theirs: {"type": "number", "minimum": 0,
                       "description": f"Read as stats v1's {mine}." + (f" {ours[mine]['description']}"
                                                                        if ours[mine].get("description") else "")}
              for mine, theirs in TORCH_MODULE_FIELDS.items()}
    return {"type": "object", "title": "TorchModStats", "description": "PyTorch's ModStats of one module.",
            "properties": {"fqn": {"type": "string"}, "is_leaf": {"type": "boolean"}, **fields},
            "required": _TORCH_REQUIRED}


def _torch_sac_stats() -> dict[str, Any]:
    indices = {"type": "array", "items": {"type": "integer", "minimum": 0}}
    return {
        "type": "object", "title": "TorchSACStats",
        "description": "PyTorch's SACStats of one module: one entry per op in each list.",
        "properties": {
            "func_names": {"type": "array", "items": {"type": "string"}, "description": "The ops, in order."},
            "runtimes": {"type": "array", "items": {"type": "number", "minimum": 0}, "description": "ms per op."},
            "memory": {"type": "array", "items": {"type": "integer", "minimum": 0},
                       "description": "Bytes of each op's outputs."},
            "view_like_ops": indices, "rand_ops": indices, "saved_autograd_ops": indices,
            "inplace_ops": {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0},
                                                       "minItems": 2, "maxItems": 2},
                            "description": "[op, the op it writes in place] pairs."},
            "force_store_random": {"type": "boolean"},
        },
        "required": ["func_names", "runtimes", "memory"],
    }


def _torch_stats() -> dict[str, Any]:
    """PyTorch's ``module_info`` + ``sac_stats`` as the planner reads them (other fields are ignored)."""
    order = {"type": "array", "items": {"type": "string"}}
    return {
        "type": "object", "title": "TorchStats",
        "description": "PyTorch's format: torch.distributed._tools' ModuleInfo and per-module SACStats, as JSON.",
        "properties": {
            "model": {"type": "string", "description": "The model's name (stats v1's metadata.model_name)."},
            "module_info": {
                "type": "object",
                "properties": {
                    "mod_order": {"type": "object", "properties": {"fw_pre_order": order, "fw_post_order": order},
                                  "required": ["fw_pre_order", "fw_post_order"]},
                    "mod_stats": {"type": "array", "items": {"$ref": _REF.format(model="TorchModStats")}},
                },
                "required": ["mod_order", "mod_stats"],
            },
            "sac_stats": {"type": "object", "additionalProperties": {"$ref": _REF.format(model="TorchSACStats")},
                          "description": "Per module fqn, its SACStats (modules without one are not checkpointed)."},
        },
        "required": ["module_info"],
    }


def declare_stats_formats(schema: dict[str, Any]) -> None:
    """Add the stats formats to ``schema``'s components and point the upload body and inline ``stats`` at them."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    v1 = planner.Stats.model_json_schema(ref_template=_REF)
    for name, part in {**v1.pop("$defs", {}), "Stats": v1, "TorchStats": _torch_stats(),
                       "TorchModStats": _torch_module(), "TorchSACStats": _torch_sac_stats()}.items():
        if components.get(name, part) != part:
            raise ValueError(f"components.schemas.{name} is already another schema")
        components[name] = part
    components[STATS_DOCUMENT] = {
        "title": "Stats document",
        "description": "sacplan stats v1 (what `sacplan collect` writes; `sacplan schema` prints its JSON Schema), "
                       "or PyTorch's format (module_info + sac_stats).",
        "oneOf": [{"$ref": _REF.format(model="Stats")}, {"$ref": _REF.format(model="TorchStats")}],
    }
    document = {"$ref": _REF.format(model=STATS_DOCUMENT)}
    upload = schema["paths"]["/v1/stats"]["post"]["requestBody"]["content"]["application/json"]
    upload["schema"] = document
    for request in ("PlanRequest", "SweepRequest"):
        stats = components[request]["properties"]["stats"]
        components[request]["properties"]["stats"] = {**document, "description": stats.get("description", "")}

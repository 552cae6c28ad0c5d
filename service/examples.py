"""Swagger UI examples: a stats v1 document made by today's collector (a two-layer MLP) and requests using it.

``example_stats.json`` is what ``sacplan collect`` writes for the model in
``tests/service/docs/make_example_stats.py``, which regenerates it;
``tests/service/docs/test_example_stats.py`` fails when the collector would
write something else. Every example request succeeds as it stands on a fresh
database: the plan and sweep requests carry the stats inline (stored as an
upload of them would be), and every budget they ask for fits
(``tests/service/docs/test_openapi.py`` holds them to it).
"""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

__all__ = ["EXAMPLE_STATS", "EXAMPLE_PLAN_REQUEST", "EXAMPLE_SWEEP_REQUEST", "EXAMPLE_OFFLOAD_PLAN_REQUEST",
           "EXAMPLE_OFFLOAD_SWEEP_REQUEST", "EXAMPLE_PIPELINE_STATS", "EXAMPLE_PIPELINE_BUDGET_GIB"]

EXAMPLE_STATS: dict[str, Any] = json.loads((files("service") / "example_stats.json").read_text())

# The stats have a 0.89 GiB peak without checkpointing and fit 0.672 GiB at best: every budget here fits.
EXAMPLE_PLAN_REQUEST: dict[str, Any] = {
    "stats": EXAMPLE_STATS,
    "memory_budget_gib": 0.7,
    "world_size": 1,
    "ac_units": None,
    "fsdp_units": None,
    "time_limit_s": 10.0,
}

EXAMPLE_SWEEP_REQUEST: dict[str, Any] = {
    "stats": EXAMPLE_STATS,
    "budgets_gib": [0.7, 0.75, 0.8, 0.85, 0.9],
    "world_size": 1,
    "time_limit_s": 10.0,
}

# Offloading (docs/memory-model.md, "Offloading"): keep, recompute or offload to host memory. The stats carry the
# A100-80GB's host link (24 GB/s per direction, the device table's); host_link_gbps overrides it, as for a board
# whose GPUs share a PCIe switch. With two layers nothing pays to offload (the first layer's offload would leave
# the device only after the last layer's forward, past the peak), so these answer as the requests above do.
EXAMPLE_OFFLOAD_PLAN_REQUEST: dict[str, Any] = {**EXAMPLE_PLAN_REQUEST, "offload": "on", "host_link_gbps": 16.0}
EXAMPLE_OFFLOAD_SWEEP_REQUEST: dict[str, Any] = {**EXAMPLE_SWEEP_REQUEST, "offload": "on", "host_link_gbps": 16.0}

# ``example_pipeline_stats.json``: the two stages of a two-layer Llama under 1F1B, four microbatches, as
# ``sacplan collect --pp-stages 2`` writes them (``tests/service/docs/make_example_pipeline_stats.py``). Stage 0
# peaks at 1.28 MiB without checkpointing and every stage fits 0.00112 GiB at best: at this budget each stage
# checkpoints something. A pipeline plan names uploads by id, so its request example is its fields' own (an id
# names nothing on a fresh database); its answer is made from these stages (service.docs.response_examples).
EXAMPLE_PIPELINE_STATS: list[dict[str, Any]] = json.loads(
    (files("service") / "example_pipeline_stats.json").read_text())["stages"]
EXAMPLE_PIPELINE_BUDGET_GIB = 0.00115

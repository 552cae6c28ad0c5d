"""The API docs' stats example is what today's collector writes (``make_example_stats.py`` regenerates it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import planner
from service.examples import EXAMPLE_STATS

# Which torch and which release collected it change nothing the docs show.
VERSIONS = ("torch_version", "collector_version")


def _without_versions(doc: dict) -> dict:
    return {**doc, "metadata": {k: v for k, v in doc["metadata"].items() if k not in VERSIONS}}


def test_the_example_is_valid_stats_with_a_timeline():
    stats = planner.parse_stats(EXAMPLE_STATS)
    assert stats.timeline and stats.root.optimizer_state_bytes > 0  # the step model, every phase
    assert "before planner" not in planner.plan(stats, 0.7).memory_model_note  # not "collected before planner 0.5"


# the ops' forward-moment fields (planner 0.7.x, docs/memory-model.md "Forward moments inside a checkpointed module")
FORWARD_FIELDS = ("forward_key", "forward_live_bytes", "unsaved_last_ops")


def test_the_host_link_and_forward_fields_leave_the_rest_of_the_example_as_it_was():
    """The collector writes metadata.host_link_gbps for a GPU target (A100-80GB: the device table's PCIe Gen4 x16
    figure) and the ops' forward-moment fields; without them the document is the one made before those fields
    existed, hash and all."""
    link = EXAMPLE_STATS["metadata"]["host_link_gbps"]
    assert (link["d2h"], link["h2d"]) == (24.0, 24.0) and link["source"].startswith("A100-80GB: PCIe Gen4 x16")
    assert any(name in op for m in EXAMPLE_STATS["modules"] for op in m.get("ops") or () for name in FORWARD_FIELDS)
    modules = [{**m, "ops": None if m.get("ops") is None else [
        {k: v for k, v in op.items() if k not in FORWARD_FIELDS} for op in m["ops"]]} for m in EXAMPLE_STATS["modules"]]
    before = {**EXAMPLE_STATS, "modules": modules,
              "metadata": {k: v for k, v in EXAMPLE_STATS["metadata"].items() if k != "host_link_gbps"}}
    # service/example_stats.json as made at main 625d5f7 (before the field), hashed there
    assert planner.stats_hash(planner.parse_stats(before)) == (
        "ace5d6cd225edab5914d36def3778727c65f27823a3a55b518faa1900604e7d6")


@pytest.mark.slow
def test_the_example_is_what_the_collector_writes_today():
    pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        from make_example_stats import EXAMPLE, collect
    finally:
        sys.path.pop(0)
    stored = json.loads(EXAMPLE.read_text())
    assert _without_versions(collect()) == _without_versions(stored), (
        "the collector writes another example now: run python tests/service/docs/make_example_stats.py")

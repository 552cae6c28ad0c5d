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

"""Every figure the service stores fits its column, on SQLite and PostgreSQL: stats at the edges of every
numeric field are stored or refused with a 422 naming the field, never a 500, and a refusal stores nothing.

Issue 33: the README's example stats with the root's param_bytes, grad_bytes and optimizer_state_bytes at
2**62 each (each within the format's bound) answered 500 (SQLite: OverflowError; PostgreSQL: bigint out of
range), because their sum, the baseline peak, went to a 64-bit column unchecked.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from planner import GIB
from planner.stats.format import MAX_BYTES

from service.examples import EXAMPLE_STATS
from service.store import StatsRecord, column_bounds

INT64_MAX = 2**63 - 1
NOTHING = {"stats": 0, "stats_tags": 0, "plans": 0, "sweeps": 0}


def _example() -> dict:
    return json.loads(json.dumps(EXAMPLE_STATS))


def _root(doc: dict) -> dict:
    return next(m for m in doc["modules"] if m["parent"] is None)


def _overflowing() -> dict:
    doc = _example()
    for field in ("param_bytes", "grad_bytes", "optimizer_state_bytes"):
        _root(doc)[field] = 2**62
    return doc


def test_the_columns_bounds_are_the_narrower_databases():
    # PostgreSQL's integer is 32-bit (SQLite's 64-bit), bigint 64-bit on both.
    assert column_bounds(StatsRecord, "module_count") == (-(2**31), 2**31 - 1)
    assert column_bounds(StatsRecord, "baseline_peak_bytes") == (-(2**63), INT64_MAX)


def test_a_sum_past_bigint_is_422_naming_it_and_stores_nothing(client, count_rows):
    doc = _overflowing()
    r = client.post("/v1/stats", json=doc)
    assert r.status_code == 422, r.text
    error = r.json()["errors"][0]
    assert error["loc"] == ["modules"] and error["input"] > INT64_MAX
    assert r.json()["detail"].startswith(f"baseline_peak_bytes {error['input']} (")
    inline = client.post("/v1/plans", json={"stats": doc, "memory_budget_gib": 5.0})
    assert inline.status_code == 422, inline.text
    assert inline.json()["errors"][0]["loc"] == ["body", "stats", "modules"]
    assert count_rows() == NOTHING


def _numeric_paths(doc: dict) -> list[tuple]:
    """Where the document holds a number (booleans are not numbers here), as key paths."""
    paths: list[tuple] = []

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, (*path, k))
        elif isinstance(node, list):
            for k, v in enumerate(node):
                walk(v, (*path, k))
        elif isinstance(node, (int, float)) and not isinstance(node, bool):
            paths.append(path)

    walk(doc, ())
    return paths


def _with_optional_numbers() -> dict:
    """The example with the optional numeric fields written out too, so they are at the edges as well."""
    doc = _example()
    for m in doc["modules"]:
        m.update(optimizer_state_bytes=m["param_bytes"], held_input_bytes=0)
        if not m["is_leaf"]:
            m.update(act_bw_bytes=m["act_total_bytes"], checkpoint_overhead_ms=0.5, saved_op_overhead_ms=0.1)
    return doc


BASE = _with_optional_numbers()
PATHS = _numeric_paths(BASE)
# Each bound of the format (bytes 2**62, counts 2**31, milliseconds 1e12), one past it, and 64-bit's.
EDGES = [0, 1, -1, 0.5, 2**31 - 1, 2**31, 2**62 - 1, 2**62, 2**62 + 1, 2**63 - 1, 2**63, 1e12, 1.5e12, 1e308]


def _set(doc: dict, path: tuple, value) -> None:
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


edited_stats = st.lists(st.tuples(st.sampled_from(PATHS), st.sampled_from(EDGES)), min_size=1, max_size=12)


@pytest.mark.slow
@hypothesis_settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=edited_stats, reserve_gib=st.sampled_from([0.0, 1.0, MAX_BYTES / GIB]))
def test_stats_at_the_edges_are_stored_or_refused_never_500(client, count_rows, edits, reserve_gib):
    doc = json.loads(json.dumps(BASE))
    for path, value in edits:
        _set(doc, path, value)
    before = count_rows()
    r = client.post("/v1/stats", json=doc)  # the test client raises what the app would answer 500 with
    assert r.status_code in (200, 201, 422), r.text
    if r.status_code == 422:
        assert r.json()["errors"] and all(e["loc"] for e in r.json()["errors"])
        assert count_rows() == before
    else:
        summary = r.json()
        assert 0 <= summary["baseline_peak_bytes"] <= INT64_MAX
        assert client.get(f"/v1/stats/{summary['id']}").status_code == 200
    plan = client.post("/v1/plans", json={"stats": doc, "memory_budget_gib": 5.0, "reserve_gib": reserve_gib,
                                          "time_limit_s": 10})
    assert plan.status_code in (200, 201, 422), plan.text
    if plan.status_code == 422:
        assert plan.json()["errors"][0]["loc"][0] == "body"
        assert count_rows()["plans"] == before["plans"]
    else:
        peak = plan.json()["peak_bytes"]
        assert peak is None or 0 <= peak <= INT64_MAX

"""PlanOptions: one model behind plan()/sweep(), the CLI's flags and the service's request bodies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from planner import PlanOptions, load_stats, plan, sweep

L4 = Path(__file__).resolve().parents[1] / "data" / "torch_format_transformer_L4.json"


def test_options_object_and_keywords_give_the_same_plan():
    stats = load_stats(L4)
    by_keywords = plan(stats, 4.0, world_size=2, ac_units=["Transformer.layers.0", "Transformer.layers.1"])
    opts = PlanOptions(world_size=2, ac_units=["Transformer.layers.0", "Transformer.layers.1"])
    by_object = plan(stats, 4.0, options=opts)
    assert by_object.model_dump(exclude={"solve_seconds"}) == by_keywords.model_dump(exclude={"solve_seconds"})
    assert [p.recompute_ms for p in sweep(stats, [3.0, 4.0], options=opts)][1] == by_object.recompute_ms


def test_options_and_keywords_together_are_refused():
    with pytest.raises(TypeError, match="not both"):
        plan(L4, 4.0, options=PlanOptions(), world_size=2)


def test_an_unknown_option_is_named():
    with pytest.raises(ValueError, match=r"^world_sise is not a plan option \(options: world_size, "):
        plan(L4, 4.0, world_sise=2)


@pytest.mark.parametrize("field,value,match", [
    ("world_size", True, "world_size must be a positive integer, got True"),
    ("world_size", 2.0, "world_size must be a positive integer, got 2.0"),
    ("time_limit_s", True, "time_limit_s must be a positive number of seconds, got True"),
    ("time_limit_s", float("inf"), "time_limit_s must be a positive number of seconds, got inf"),
    ("mip_rel_gap", "0.1", r"mip_rel_gap must be in \[0, 1\), got '0.1'"),
    ("first_step_only", 1, "first_step_only must be true or false, got 1"),
    ("fsdp_units", "Transformer", "fsdp_units must be a list of module fqns, got the string 'Transformer'"),
    ("ac_units", [3], r"ac_units\[0\] must be a module fqn \(a string\), got 3"),
    ("host_budget_gib", 0, r"host_budget_gib must be a positive number of GiB \(at most \d+\), got 0"),
    ("host_budget_gib", float("nan"), r"host_budget_gib must be a positive number of GiB \(at most \d+\), got nan"),
    ("host_budget_gib", "32", r"host_budget_gib must be a positive number of GiB \(at most \d+\), got '32'"),
])
def test_bad_values_name_the_field_and_the_value(field, value, match):
    with pytest.raises(ValueError, match="^" + match):
        plan(L4, 4.0, **{field: value})


def test_cache_fields_treat_unit_lists_as_sets():
    a = PlanOptions(ac_units=["b", "a", "b"], time_limit_s=30)
    b = PlanOptions(ac_units=["a", "b"], time_limit_s=30.0)
    assert a.cache_fields() == b.cache_fields()
    assert a.cache_fields()["ac_units"] == ["a", "b"]
    # every option changes the key; offload's options only when offload is on (an off plan ignores them)
    assert set(a.cache_fields()) == set(PlanOptions.model_fields) - {"offload", "host_link_gbps", "host_budget_gib"}
    # host_budget_gib only when set (keys made before it existed stay valid), and only with offload on
    assert set(PlanOptions(offload="on").cache_fields()) == set(PlanOptions.model_fields) - {"host_budget_gib"}
    capped = PlanOptions(offload="on", host_budget_gib=32).cache_fields()
    assert capped["host_budget_gib"] == 32.0 and isinstance(capped["host_budget_gib"], float)
    assert "host_budget_gib" not in PlanOptions(host_budget_gib=32).cache_fields()


def test_every_option_is_a_cli_flag():
    # The flags are generated from the model: a new field shows up without touching the CLI.
    r = subprocess.run([sys.executable, "-m", "planner.cli", "plan", "--help"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    flags = {"world_size": "--world-size", "ac_units": "--ac-unit", "fsdp_units": "--fsdp-unit",
             "time_limit_s": "--time-limit", "mip_rel_gap": "--mip-rel-gap", "solver": "--solver",
             "first_step_only": "--first-step-only", "reserve_gib": "--reserve-gib", "offload": "--offload",
             "host_link_gbps": "--host-link-gbps", "host_budget_gib": "--host-budget-gib"}
    assert set(flags) == set(PlanOptions.model_fields)
    for flag in flags.values():
        assert flag in r.stdout

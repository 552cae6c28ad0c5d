"""``sacplan plan / sweep / schema`` as a user runs them: exit codes, JSON on stdout, tables."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner import load_stats

L4 = Path(__file__).resolve().parents[1] / "data" / "torch_format_transformer_L4.json"
GIB = 2**30


def sacplan(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "planner.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def test_plan_json_optimal():
    r = sacplan("plan", L4, "--budget-gib", "4", "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["status"] == "optimal"
    assert plan["peak_bytes"] <= 4 * GIB
    stats = load_stats(L4)
    for m in plan["modules"]:
        assert len(m["save"]) == len(stats.module(m["fqn"]).ops)


def test_plan_infeasible_exit_2_with_minimum_in_message_and_json():
    r = sacplan("plan", L4, "--budget-gib", "1", "--json")
    assert r.returncode == 2
    plan = json.loads(r.stdout)
    assert plan["status"] == "infeasible"
    minimum = plan["min_feasible_budget_gib"]
    assert minimum > 1
    assert f"{minimum:g} GiB" in r.stderr
    again = sacplan("plan", L4, "--budget-gib", minimum, "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["status"] == "optimal"


def test_plan_table_lists_checkpointed_modules():
    r = sacplan("plan", L4, "--budget-gib", "5")
    assert r.returncode == 0
    assert "status           optimal" in r.stdout
    assert "Transformer.layers." in r.stdout


def test_sweep_json_and_table():
    r = sacplan("sweep", L4, "--budgets-gib", "1,4,9", "--json")
    assert r.returncode == 2  # one budget is infeasible
    plans = json.loads(r.stdout)
    assert [p["status"] for p in plans] == ["infeasible", "optimal", "optimal"]
    assert "[3/3]" in r.stderr
    r = sacplan("sweep", L4, "--budgets-gib", "4,9")
    assert r.returncode == 0
    assert "budget GiB" in r.stdout


@pytest.mark.parametrize("args,match", [
    (["plan", "missing.json", "--budget-gib", "4"], "does not exist"),
    (["plan", L4, "--budget-gib", "-2"], "memory_budget_gib must be a positive number"),
    (["plan", L4, "--budget-gib", "4", "--ac-unit", "Nope"], "ac_units[0] 'Nope' is not a module"),
    (["plan", L4, "--budget-gib", "4", "--world-size", "0"], "world_size must be a positive integer"),
    (["sweep", L4, "--budgets-gib", "2,x"], "is not a comma-separated list"),
    (["plan", L4, "--budget-gib", "4", "--mip-rel-gap", "1.5"], "mip_rel_gap must be in [0, 1), got 1.5"),
])
def test_bad_input_exit_1(args, match):
    r = sacplan(*args)
    assert r.returncode == 1
    assert match in r.stderr


def test_bad_stats_file_names_the_field(tmp_path):
    doc = json.loads(L4.read_text())
    doc["module_info"]["mod_stats"][0]["act_total"] = -1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    r = sacplan("plan", bad, "--budget-gib", "4")
    assert r.returncode == 1
    assert "modules[0].act_total_bytes" in r.stderr and "got -1" in r.stderr


def test_schema_is_json_schema_of_stats_and_plan():
    r = sacplan("schema")
    schema = json.loads(r.stdout)
    assert "fw_post_order" in schema["properties"] and "ModuleStats" in schema["$defs"]
    r = sacplan("schema", "--plan")
    assert "min_feasible_budget_gib" in json.loads(r.stdout)["properties"]

"""``sacplan plan / sweep / schema`` as a user runs them: exit codes, JSON on stdout, tables."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner import PLANNER_VERSION, Plan, load_stats
from planner.cli_plan import exit_code, sweep_table

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
    (["plan", L4, "--budget-gib", "-2"], "--budget-gib must be a positive number of GiB, got -2"),
    (["plan", L4, "--budget-gib", "0"], "--budget-gib must be a positive number of GiB, got 0"),
    (["plan", L4, "--budget-gib", "4", "--ac-unit", "Nope"], "--ac-unit 'Nope' is not a module"),
    (["plan", L4, "--budget-gib", "4", "--world-size", "0"], "--world-size must be a positive integer, got 0"),
    (["plan", L4, "--budget-gib", "4", "--time-limit", "-1"], "--time-limit must be a positive number of seconds, got -1"),
    (["plan", L4, "--budget-gib", "4", "--mip-rel-gap", "1.5"], "--mip-rel-gap must be in [0, 1), got 1.5"),
    (["plan", L4, "--budget-gib", "4", "--mip-rel-gap", "2"], "--mip-rel-gap must be in [0, 1), got 2"),
    (["plan", L4, "--budget-gib", "4", "--reserve-gib", "-1"], "--reserve-gib must be a number of GiB from 0 to 4294967296, got -1"),
    (["plan", L4, "--budget-gib", "4", "--world-size", "x"], "argument --world-size: invalid int value: 'x'"),
    (["sweep", L4, "--budgets-gib", "2,x"], "--budgets-gib entry 2 'x' is not a number"),
    (["sweep", L4, "--budgets-gib", "4,,6"], "--budgets-gib entry 2 '' is not a number"),
    (["sweep", L4, "--budgets-gib", "4,6,"], "--budgets-gib entry 3 '' is not a number"),
    (["sweep", L4, "--budgets-gib", "4,-1"], "--budgets-gib entry 2 must be a positive number of GiB, got -1"),
    (["sweep", L4, "--budgets-gib", "-1"], "--budgets-gib entry 1 must be a positive number of GiB, got -1"),
    # issue 32: a typo is named with the closest option, never reported as a missing --budget-gib
    (["plan", L4, "--budgt-gib", "4"], "unknown option --budgt-gib (did you mean --budget-gib?)"),
    (["plan", L4, "--budget-gib", "4", "--wrold-size=2"], "unknown option --wrold-size (did you mean --world-size?)"),
    (["--verison"], "unknown option --verison (did you mean --version?)"),
    # ... and no prefix stands for an option
    (["plan", L4, "--budget", "4"], "unknown option --budget (did you mean --budget-gib?)"),
    (["sweep", L4, "--budgets", "4"], "unknown option --budgets (did you mean --budgets-gib?)"),
    # a budget typed in bytes
    (["plan", L4, "--budget-gib", "4294967296"], "--budget-gib 4294967296 GiB is over 64 TiB per rank: did you "
                                                 "mean bytes? (4294967296 bytes is 4 GiB"),
    (["sweep", L4, "--budgets-gib", "4,8589934592"], "--budgets-gib entry 2 8589934592 GiB is over 64 TiB"),
])
def test_bad_input_exit_1(args, match):
    r = sacplan(*args)
    assert r.returncode == 1
    assert match in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("make,name", [
    (lambda d: d.mkdir(), "a directory"),
    (lambda f: f.write_bytes(b"\xff\xfe\x00\x81 not utf-8"), "binary.json"),
    (lambda f: f.write_bytes(b""), "empty.json"),
])
def test_unreadable_stats_file_exit_1_names_the_path(tmp_path, make, name):
    path = tmp_path / name
    make(path)
    r = sacplan("plan", path, "--budget-gib", "4")
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert str(path) in r.stderr


@pytest.mark.parametrize("args", [["plan", L4, "--budget-gib", "4"], ["sweep", L4, "--budgets-gib", "4,9", "--json"]])
def test_closed_stdout_exits_quietly(args):
    read_end, write_end = os.pipe()
    os.close(read_end)  # closed before the command writes: like `| head` exiting early, but without the race
    try:
        r = subprocess.run([sys.executable, "-m", "planner.cli", *map(str, args)], stdout=write_end,
                           stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write_end)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and "BrokenPipeError" not in r.stderr


def test_no_plan_in_time_exit_3():
    # a time limit of 1 ns stops HiGHS before it finds any plan; 4 GiB needs checkpointing (baseline 7.1 GiB)
    r = sacplan("plan", L4, "--budget-gib", "4", "--solver", "milp", "--time-limit", "1e-9", "--json")
    assert json.loads(r.stdout)["status"] == "time_limit"
    assert r.returncode == 3
    assert "4 GiB: time_limit" in r.stderr
    assert "raise --time-limit" in r.stderr and "time_limit_s" not in r.stderr  # the option the user types


def test_sweep_infeasible_and_no_plan_in_time_exit_3():
    # one 1 ns time limit for the whole sweep: 1 GiB is below the exact smallest peak (told without solving),
    # 4 GiB is not reached in time
    r = sacplan("sweep", L4, "--budgets-gib", "1,4", "--time-limit", "1e-9", "--json")
    assert [p["status"] for p in json.loads(r.stdout)] == ["infeasible", "time_limit"]
    assert r.returncode == 3
    assert "no plan fits 1 GiB" in r.stderr and "4 GiB: time_limit" in r.stderr


def _plan(status, **fields):
    return Plan(status=status, memory_budget_gib=4.0, baseline_peak_bytes=8 * GIB, compute_ms=100.0,
                planner_version=PLANNER_VERSION, **fields)


@pytest.mark.parametrize("statuses,code", [
    (["optimal", "feasible"], 0),
    (["optimal", "infeasible"], 2),
    (["time_limit"], 3),
    (["error"], 3),
    (["infeasible", "time_limit", "optimal"], 3),  # a budget without a plan for another reason outranks infeasible
    (["infeasible", "error"], 3),
])
def test_exit_code_rule(statuses, code):
    assert exit_code([_plan(s) for s in statuses]) == code


@pytest.mark.parametrize("command", ["plan", "sweep"])
def test_help_lists_every_exit_code(command):
    r = sacplan(command, "--help")
    assert r.returncode == 0
    for line in ("0  optimal or feasible", "1  bad input", "2  infeasible", "3  no plan found"):
        assert line in r.stdout


def test_infeasible_plan_table_has_no_unit_on_absent_peak():
    r = sacplan("plan", L4, "--budget-gib", "1")
    assert r.returncode == 2
    assert "peak             -  (no checkpointing: " in r.stdout
    assert "- GiB" not in r.stdout


def test_sweep_table_shows_the_gap_of_feasible_rows():
    table = sweep_table([_plan("feasible", peak_bytes=4 * GIB, recompute_ms=5.0, mip_gap=0.0123),
                          _plan("optimal", peak_bytes=4 * GIB, recompute_ms=5.0, mip_gap=0.0)])
    rows = table.splitlines()[1:]
    assert "feasible (gap 1.23%)" in rows[0]
    assert "gap" not in rows[1]


def test_first_step_only_without_any_optimizer_state_notes_it():
    assert load_stats(L4).root.optimizer_state_bytes == 0  # PyTorch-format stats carry none
    r = sacplan("plan", L4, "--budget-gib", "4", "--first-step-only")
    assert r.returncode == 0
    assert "--first-step-only changes nothing" in r.stderr
    assert "--first-step-only" not in sacplan("plan", L4, "--budget-gib", "4").stderr


def test_bad_stats_file_names_the_field(tmp_path):
    doc = json.loads(L4.read_text())
    doc["module_info"]["mod_stats"][0]["act_total"] = -1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    r = sacplan("plan", bad, "--budget-gib", "4")
    assert r.returncode == 1
    # stats v1's name (modules[0].act_total_bytes) or the input's own (module_info.mod_stats[0].act_total)
    assert "[0].act_total" in r.stderr and "got -1" in r.stderr


def test_version():
    r = sacplan("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"sacplan {PLANNER_VERSION}"


@pytest.mark.parametrize("command,what", [(["plan", L4, "--budget-gib", "4", "--json"], "a plan"),
                                          (["sweep", L4, "--budgets-gib", "4,5", "--json"], "a list of plans")])
def test_a_plan_given_as_stats_is_recognised(tmp_path, command, what):
    made = tmp_path / "plan.json"
    made.write_text(sacplan(*command).stdout)
    r = sacplan("plan", made, "--budget-gib", "4")
    assert r.returncode == 1
    assert f"this is {what} (what sacplan {command[0]} --json answers), not stats" in r.stderr
    assert "field required" not in r.stderr


def test_schema_is_json_schema_of_stats_and_plan():
    r = sacplan("schema")
    schema = json.loads(r.stdout)
    assert "fw_post_order" in schema["properties"] and "ModuleStats" in schema["$defs"]
    r = sacplan("schema", "--plan")
    assert "min_feasible_budget_gib" in json.loads(r.stdout)["properties"]

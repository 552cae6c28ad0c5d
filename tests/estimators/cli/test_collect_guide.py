"""What ``sacplan collect`` says after collecting (issue 18, point 3): the fit, budgets with plans, the next command.

Known answers come from the planner itself (``planner.min_feasible_budget_gib``,
``planner.baseline_peak_bytes``, plans), and each printed command is run.
"""

from __future__ import annotations

import json
import random
import shlex
from pathlib import Path


from estimators.cli import guide
from estimators.cli.guide import suggested_budgets
from estimators.cli.summary import guidance_rows
from planner import GIB, baseline_peak_bytes, load_stats, min_feasible_budget_gib
from planner.cli import main

L4 = Path(__file__).resolve().parents[2] / "data" / "torch_format_transformer_L4.json"


def _run_printed(command: str, capsys) -> dict:
    """Run a printed ``sacplan plan ...`` command (with --json) through the CLI; its exit code and plan."""
    argv = shlex.split(command)
    assert argv[:2] == ["sacplan", "plan"]
    capsys.readouterr()
    code = main(argv[1:] + ["--json"])
    return {"code": code, "plan": json.loads(capsys.readouterr().out)}


def test_suggested_budgets_are_readable_and_inside_the_range():
    # three significant digits: 0.0031234 rounds up to 0.00313, 0.00512 stays
    assert suggested_budgets(0.0031234, 0.00512, None) == [0.00313, 0.00412, 0.00512]
    # an 80 GB device (74.506 GiB) over a 105.9 GiB step: the top is the device, rounded down
    assert suggested_budgets(37.394, 105.9, 80e9 / GIB) == [37.4, 56.0, 74.5]
    rng = random.Random(18)
    for _ in range(200):
        low = 10 ** rng.uniform(-3, 3)
        base = low * rng.uniform(1.0, 5.0)
        device = base * rng.uniform(0.5, 2.0) if rng.random() < 0.7 else None
        top = base if device is None else device
        if top < low:
            continue
        budgets = suggested_budgets(low, base, device)
        assert budgets == sorted(budgets) and 1 <= len(budgets) <= 3
        assert budgets[0] >= low, (low, base, device, budgets)
        if len(budgets) > 1:
            assert budgets[-1] <= top, (low, base, device, budgets)


def test_step_too_big_for_one_device_is_sharded_and_the_command_plans(capsys):
    stats = load_stats(L4)
    one, two = min_feasible_budget_gib(stats), min_feasible_budget_gib(stats, world_size=2)
    assert two < one  # sharding parameters and gradients lowers the smallest budget
    device_bytes = int((one + two) / 2 * GIB)  # between the two: fits only over 2 ranks
    g = guide(stats, str(L4), "test device", device_bytes)
    assert g.fits_as_is is False and g.fits_with_plan is False and g.world_size == 2
    assert g.min_budget_gib == one and g.sharded_min_budget_gib == two
    assert "--world-size 2" in g.next_command
    ran = _run_printed(g.next_command, capsys)
    assert ran["code"] == 0 and ran["plan"]["status"] == "optimal"
    assert ran["plan"]["peak_bytes"] <= device_bytes
    text = dict(guidance_rows(g))
    assert text["fits with checkpointing"].startswith(f"no: the smallest budget with a plan is {one:g} GiB")
    assert text["sharded"].startswith("with --world-size 2")


def test_step_that_fits_with_checkpointing_gets_budgets_with_their_recompute(capsys):
    stats = load_stats(L4)
    device_bytes = int(5 * 10**9)  # between the smallest budget (2.19 GiB) and no checkpointing (7.11 GiB)
    g = guide(stats, str(L4), "test device", device_bytes)
    assert g.fits_as_is is False and g.fits_with_plan is True and g.world_size == 1
    budgets = [p.memory_budget_gib for p in g.suggestions]
    assert len(budgets) == 3 and budgets[0] >= g.min_budget_gib and budgets[-1] * GIB <= device_bytes
    recompute = [p.recompute_ms for p in g.suggestions]
    assert recompute == sorted(recompute, reverse=True)  # more memory, less recompute
    ran = _run_printed(g.next_command, capsys)
    assert ran["code"] == 0 and ran["plan"]["memory_budget_gib"] == budgets[-1]


def test_step_that_fits_as_is_and_step_that_fits_nowhere():
    stats = load_stats(L4)
    roomy = guide(stats, "s.json", "big", 2 * baseline_peak_bytes(stats))
    assert roomy.fits_as_is is True and roomy.suggestions[-1].modules == []  # no checkpointing needed at the top
    # issue 32: the next line suggests no plan that checkpoints nothing; freeing memory is offered apart
    rows = dict(guidance_rows(roomy))
    assert rows["next"] == "nothing to plan: the step fits big without checkpointing"
    assert roomy.next_command.startswith("sacplan plan s.json --budget-gib ")
    assert rows["to free memory"].startswith(roomy.next_command)
    budget = float(roomy.next_command.split("--budget-gib ")[1])
    assert [p.modules != [] for p in roomy.suggestions if p.memory_budget_gib == budget] == [True]
    tiny = guide(stats, "s.json", "tiny", 1000)
    assert tiny.next_command is None and tiny.suggestions == []
    assert "nothing fits this device" in dict(guidance_rows(tiny))["sharded"]

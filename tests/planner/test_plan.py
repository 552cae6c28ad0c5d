"""Module-level plans: brute force on small trees, realized == reported, samples, outcomes."""

import math
import random
from pathlib import Path

import pytest

from planner import Stats, StatsError, load_stats, plan, sweep
from plan_helpers import brute_force, check_plan, module_options, random_ops, realize

GIB = 2**30
DATA = Path(__file__).resolve().parents[1] / "data"
L4 = DATA / "torch_format_transformer_L4.json"  # copies of ../shared/reference's samples
L12 = DATA / "torch_format_transformer_L12.json"


# random small instances

def random_stats(rng) -> Stats:
    """Root R with 1-2 blocks, each block non-leaf (with ops) holding 1-2 leaves; <= 6 modules."""
    mods = [dict(fqn="R", parent=None, is_leaf=False)]
    pre, post = ["R"], []
    for b in range(rng.choice([1, 2])):
        bf = f"R.b{b}"
        mods.append(dict(fqn=bf, parent="R", is_leaf=False, ops=random_ops(rng, rng.randrange(2, 6)),
                         force_store_random=rng.random() < 0.25))
        pre.append(bf)
        n_leaves = 1 if len(mods) >= 4 else rng.choice([1, 2])
        for j in range(n_leaves):
            lf = f"{bf}.l{j}"
            if rng.random() < 0.3 and len(mods) < 5:
                # a nested non-leaf with ops, so nesting constraints matter
                mods.append(dict(fqn=lf, parent=bf, is_leaf=False, ops=random_ops(rng, rng.randrange(2, 5))))
                mods.append(dict(fqn=lf + ".x", parent=lf, is_leaf=True))
                pre += [lf, lf + ".x"]
                post += [lf + ".x", lf]
            else:
                mods.append(dict(fqn=lf, parent=bf, is_leaf=True))
                pre.append(lf)
                post.append(lf)
        post.append(bf)
    post.append("R")
    mods.append(dict(fqn="R.head", parent="R", is_leaf=True))
    pre.append("R.head")
    post.insert(len(post) - 1, "R.head")
    total = 0
    for m in mods:
        total += rng.randrange(0, 2048)
        m.update(act_total_bytes=total, act_grad_bytes=rng.randrange(0, 1024),
                 act_saved_bytes=rng.randrange(0, 2048) if m.get("ops") else 0,
                 grad_total_bytes=rng.randrange(0, 512), param_bytes=rng.randrange(0, 512))
    return Stats.model_validate(dict(metadata=dict(model_name="random"), fw_pre_order=pre,
                                     fw_post_order=post, modules=mods))


@pytest.mark.parametrize("solver,world_size", [("dp", 1), ("milp", 1), ("dp", 3), ("milp", 3)])
def test_plans_equal_brute_force_on_random_trees(solver, world_size):
    # world size 3 makes the sharded terms fractional bytes: the peak must still stay within the budget
    rng = random.Random(2024 + world_size)
    compared = infeasible = 0
    for trial in range(80):
        stats = random_stats(rng)
        budget = rng.uniform(0.55, 1.05) * realize(stats, {}, world_size)[0]
        if world_size > 1 and trial % 2:
            budget = math.floor(budget)  # a whole-byte budget the fractional peak may touch
        expected = brute_force(stats, budget, world_size)
        p = plan(stats, budget / GIB, solver=solver, world_size=world_size)
        if not _is_brute_force_optimum(stats, p, expected, trial, world_size):
            infeasible += 1
            continue
        assert p.peak_bytes <= math.floor(budget)
        compared += 1
    assert compared >= 25 and infeasible >= 1


def _is_brute_force_optimum(stats, p, expected, trial, world_size=1, **terms) -> bool:
    """False when brute force found no plan (then neither may the planner); else the plan is checked in full."""
    if expected is None:
        assert p.status == "infeasible", f"trial {trial}"
        return False
    # the engines count the inputs checkpointed modules hold (planner 0.7): the re-solve under a lowered budget,
    # kept as a safety net, never runs
    assert "inputs checkpointed modules hold" not in p.message, f"trial {trial}: {p.message}"
    assert p.status == "optimal", f"trial {trial}: {p.status} {p.message}"
    assert p.recompute_ms == pytest.approx(expected, abs=1e-6), f"trial {trial}"
    check_plan(stats, p, world_size, **terms)
    return True


def with_timeline(rng, stats: Stats) -> Stats:
    """``stats`` with a random timeline (as the collector writes one), an optimizer state at the root and
    checkpointing overheads on some modules."""
    doc = stats.model_dump()
    n = len(doc["modules"])
    doc["modules"][0]["optimizer_state_bytes"] = rng.randrange(0, 1024)
    for m in doc["modules"]:
        if m["ops"] and rng.random() < 0.5:
            m["checkpoint_overhead_ms"] = round(rng.uniform(0, 2), 3)
        if m["ops"] and rng.random() < 0.2:
            m["calls"] = rng.choice([2, 3])  # a shared layer: every call is recomputed
        if m["ops"] and rng.random() < 0.3:
            m["held_input_bytes"] = rng.randrange(0, 512)  # inputs checkpointing keeps alive
    moments = [dict(phase="forward", key=k, activation_bytes=rng.randrange(0, 4096)) for k in range(n + 1)]
    moments += [dict(phase="backward", key=k, activation_bytes=rng.randrange(0, 4096), grad_bytes=rng.randrange(0, 512))
                for k in range(n, -1, -1) if rng.random() < 0.7]
    moments.append(dict(phase="optimizer", key=0, activation_bytes=rng.randrange(0, 64),
                        grad_bytes=512, optimizer_bytes=rng.randrange(0, 1024)))
    doc["timeline"] = moments
    return Stats.model_validate(doc)


@pytest.mark.parametrize("solver,world_size,first", [("dp", 1, False), ("milp", 1, False), ("dp", 2, False),
                                                     ("dp", 1, True)])
def test_step_model_plans_equal_brute_force(solver, world_size, first):
    # The step's own moments (a timeline): each discard counts where its module's post-order
    # position is below the moment's key. The reference (plan_helpers.realize) evaluates the
    # moments directly; brute force enumerates every valid plan.
    rng = random.Random(91 + world_size + 10 * first)
    compared = infeasible = 0
    for trial in range(120):
        stats = with_timeline(rng, random_stats(rng))
        base = realize(stats, {}, world_size, first_step_only=first)[0]
        budget = rng.uniform(0.7, 1.0) * base
        p = plan(stats, budget / GIB, solver=solver, world_size=world_size, first_step_only=first)
        assert p.memory_model == "step"
        expected = brute_force(stats, budget, world_size, first_step_only=first)
        if not _is_brute_force_optimum(stats, p, expected, trial, world_size, first_step_only=first):
            infeasible += 1
            continue
        assert max(t.planned_bytes for t in p.timeline) == p.peak_bytes
        compared += 1
    assert compared >= 15 and infeasible >= 1


def test_min_feasible_budget_under_the_step_model_is_exact():
    # The smallest peak any plan reaches (min_peak's DP) against brute force, on the step's own moments.
    rng = random.Random(33)
    seen = exact = 0
    for _ in range(60):
        stats = with_timeline(rng, random_stats(rng))
        p = plan(stats, 1 / GIB)
        if p.status != "infeasible":
            continue
        seen += 1
        again = plan(stats, p.min_feasible_budget_gib)
        assert again.status in ("optimal", "feasible")
        check_plan(stats, again)
        # Exact without held inputs. With them the least-peak DP leaves them out (at any moment at most one
        # checkpointed module holds its inputs there, nesting being excluded): within the largest of them.
        held = max((m.held_input_bytes for m in stats.modules), default=0)
        assert brute_force(stats, p.min_feasible_budget_gib * GIB * 0.999 - 1 - held) is None
        exact += not held
    assert seen >= 20 and exact >= 3


@pytest.mark.parametrize("solver,world_size", [("auto", 1), ("milp", 1), ("auto", 3)])
def test_min_feasible_budget_is_feasible_on_random_trees(solver, world_size):
    rng = random.Random(7 + world_size)
    seen = 0
    for _ in range(40):
        stats = random_stats(rng)
        p = plan(stats, 1e-9 + 1 / GIB, solver=solver, world_size=world_size)
        if p.status != "infeasible":
            continue
        seen += 1
        # readable: at most 6 significant digits, as the CLI and JSON show it (no 2.6521100000000004)
        assert float(f"{p.min_feasible_budget_gib:.6g}") == p.min_feasible_budget_gib
        again = plan(stats, p.min_feasible_budget_gib, solver=solver, world_size=world_size)
        assert again.status == "optimal"
        check_plan(stats, again, world_size)  # its realized peak fits the reported minimum
        # and nothing meaningfully smaller fits (brute force at 0.1% below)
        assert brute_force(stats, p.min_feasible_budget_gib * GIB * 0.999 - 1, world_size) is None
    assert seen >= 5


@pytest.fixture(scope="module")
def l4():
    return load_stats(L4)


def test_l4_sweep_realized_equals_reported(l4):
    baseline = realize(l4, {})[0]
    plans = sweep(l4, [1.5, 3, 4, 5, 6, 7, baseline / GIB + 0.5])
    assert plans[0].status == "infeasible" and plans[0].min_feasible_budget_gib > 1.5
    assert plans[-1].status == "optimal" and plans[-1].modules == [] and plans[-1].recompute_ms == 0
    assert plans[-1].baseline_peak_bytes == math.ceil(baseline)
    previous = math.inf
    for p in plans[1:]:
        assert p.status == "optimal"
        check_plan(l4, p)
        # more memory never costs more recompute
        assert p.recompute_ms <= previous + 1e-9
        previous = p.recompute_ms
    for a in plans[1:]:
        fqns = [m.fqn for m in a.modules]
        assert not any(x != y and y.startswith(x + ".") for x in fqns for y in fqns)


def test_l4_dp_and_milp_agree(l4):
    for budget in (3.0, 5.0):
        a = plan(l4, budget, solver="dp")
        b = plan(l4, budget, solver="milp")
        assert a.status == b.status == "optimal"
        assert a.recompute_ms == pytest.approx(b.recompute_ms, rel=1e-5)


def test_world_size_shards_params_and_grads(l4):
    one, four = sweep(l4, [4.0], world_size=1)[0], sweep(l4, [4.0], world_size=4)[0]
    root = l4.module(l4.fw_pre_order[0])
    assert four.baseline_peak_bytes < one.baseline_peak_bytes
    assert four.recompute_ms <= one.recompute_ms
    check_plan(l4, one, 1)
    check_plan(l4, four, 4)  # the evaluator divides P + TG_n by the world size (docs/memory-model.md)
    assert root.param_bytes > 0


def test_ac_units_restrict_choice(l4):
    units = ["Transformer.layers.0", "Transformer.layers.1", "Transformer.layers.2"]
    p = plan(l4, 5.0, ac_units=units)
    assert p.status == "optimal"
    check_plan(l4, p)
    assert p.modules and {m.fqn for m in p.modules} <= set(units)
    free = plan(l4, 5.0)
    assert free.recompute_ms <= p.recompute_ms + 1e-9
    assert {m.fqn for m in free.modules} - set(units)  # the restriction bound: the free plan uses other modules


def test_fsdp_units_forbid_enclosing_checkpoints(l4):
    units = [f"Transformer.layers.{i}.attention" for i in range(4)]
    free = plan(l4, 5.0)
    assert any(m.fqn in {f"Transformer.layers.{i}" for i in range(4)} for m in free.modules)  # the rule binds
    p = plan(l4, 5.0, fsdp_units=units)
    assert p.status == "optimal"
    check_plan(l4, p)
    for m in p.modules:  # no checkpointed module strictly contains a unit (a unit itself may be checkpointed)
        assert not any(u.startswith(m.fqn + ".") for u in units), m.fqn
    assert p.recompute_ms >= free.recompute_ms - 1e-9


def test_optimizer_state_counts_unless_first_step_only_and_reserve_is_opt_in(l4):
    # PyTorch-format stats carry no optimizer state: give the root some, as the collector does.
    # A plan holds for every step by default: from the second step on the state is live throughout.
    doc = l4.model_dump()
    root = next(m for m in doc["modules"] if m["parent"] is None)
    root["optimizer_state_bytes"] = 2 * root["param_bytes"]
    stats = Stats.model_validate(doc)
    first = plan(stats, 5.0, world_size=2, first_step_only=True)
    assert first.baseline_peak_bytes == plan(l4, 5.0, world_size=2).baseline_peak_bytes  # no state in step 1
    check_plan(stats, first, 2, first_step_only=True)
    reserved = plan(stats, 5.0, world_size=2, reserve_gib=0.5, first_step_only=True)
    check_plan(stats, reserved, 2, reserve_bytes=GIB // 2, first_step_only=True)
    assert reserved.recompute_ms >= first.recompute_ms
    steady = plan(stats, 5.0, world_size=2)
    check_plan(stats, steady, 2)
    assert steady.baseline_peak_bytes == pytest.approx(first.baseline_peak_bytes + root["optimizer_state_bytes"] / 2,
                                                       abs=1)
    assert steady.recompute_ms > first.recompute_ms
    assert steady.first_step_only is False and first.first_step_only is True


@pytest.mark.parametrize("kwargs,match", [
    (dict(memory_budget_gib=-1.0), "memory_budget_gib must be a positive number"),
    (dict(memory_budget_gib=float("nan")), "memory_budget_gib must be a positive number"),
    (dict(memory_budget_gib=4.0, world_size=0), "world_size must be a positive integer, got 0"),
    (dict(memory_budget_gib=4.0, ac_units=["nope"]), r"ac_units\[0\] 'nope' is not a module"),
    (dict(memory_budget_gib=4.0, ac_units=["Transformer.output"]), "is a leaf module"),
    (dict(memory_budget_gib=4.0, fsdp_units=["x.y"]), r"fsdp_units\[0\] 'x.y' is not a module"),
    (dict(memory_budget_gib=4.0, time_limit_s=0), "time_limit_s must be a positive number"),
    (dict(memory_budget_gib=4.0, solver="cbc"), "solver must be"),
    (dict(memory_budget_gib=4.0, reserve_gib=1e300), "reserve_gib must be a number of GiB from 0 to 4294967296"),
    (dict(memory_budget_gib=4.0, ac_units="Transformer.layers.0"),
     r"ac_units must be a list of module fqns, got the string 'Transformer.layers.0'"),
    (dict(memory_budget_gib=4.0, ac_units=["Transformer"]), r"ac_units\[0\] 'Transformer' is the root module"),
])
def test_bad_options_are_named(l4, kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan(l4, **kwargs)


def test_sweep_names_the_bad_budget(l4):
    with pytest.raises(ValueError, match=r"budgets_gib\[1\] must be a positive number of GiB, got nan"):
        sweep(l4, [4.0, float("nan")])
    with pytest.raises(ValueError, match=r"budgets_gib must be a list of numbers of GiB, got 4"):
        sweep(l4, 4)


def test_stats_may_be_a_path_or_a_document(l4):
    import json

    want = plan(l4, 4.0)
    for given in (L4, str(L4), json.loads(L4.read_text()), l4.model_dump(mode="json")):
        got = plan(given, 4.0)
        assert (got.status, got.recompute_ms, got.peak_bytes) == (want.status, want.recompute_ms, want.peak_bytes)
    with pytest.raises(StatsError, match="does not exist"):
        plan(DATA / "nope.json", 4.0)
    with pytest.raises(TypeError, match="stats must be a planner.Stats, a decoded stats document"):
        plan(42, 4.0)


def test_no_checkpointable_module_is_explained(l4):
    # every module the ac_units allow encloses an FSDP unit, so nothing can be checkpointed
    p = plan(l4, 4.0, ac_units=["Transformer.layers.0"], fsdp_units=["Transformer.layers.0.attention"])
    assert p.status == "infeasible" and "no module can be checkpointed" in p.message
    assert p.min_feasible_budget_gib * GIB >= realize(l4, {})[0]  # only the unplanned step fits


def test_budget_above_the_baseline_needs_no_checkpointing(l4):
    baseline = realize(l4, {})[0]
    for budget in (baseline, baseline * 1.5):
        for solver in ("auto", "milp"):
            p = plan(l4, budget / GIB, solver=solver)
            assert p.status == "optimal" and p.modules == [] and p.recompute_ms == 0 and p.mip_gap == 0
            check_plan(l4, p)
    just_below = plan(l4, (baseline - 2**20) / GIB)
    assert just_below.status == "optimal" and just_below.modules and just_below.recompute_ms > 0


@pytest.mark.slow
def test_l12_plans_are_realizable():
    stats = load_stats(L12)
    for budget in (3.0, 18.0):
        p = plan(stats, budget)
        assert p.status == "optimal"
        check_plan(stats, p)


def test_min_peak_dp_equals_milp_on_random_trees():
    from planner.solve.min_peak import solve_min_peak_dp
    from planner.solve.milp import solve_min_peak
    from planner.solve.problem import prepare

    rng = random.Random(31)
    for trial in range(40):
        stats = random_stats(rng)
        dp = solve_min_peak_dp(prepare(stats))
        milp = solve_min_peak(prepare(stats), time_limit_s=30)
        assert milp.status == "optimal"
        assert dp.peak_bytes == pytest.approx(milp.peak_bytes, abs=1e-6 * max(milp.peak_bytes, 1.0)), f"trial {trial}"
        assert realize(stats, {f: save for f, (save, _, _) in dp.decisions.items()})[0] == pytest.approx(dp.peak_bytes)


def _deep_stats(rng) -> Stats:
    """Random trees up to 3 levels deep, some non-leaf modules without op stats; larger than brute force allows."""
    mods = [dict(fqn="R", parent=None, is_leaf=False)]
    pre, post = ["R"], []

    def add(parent, depth):
        name = f"{parent}.m{len(mods)}"
        if depth < 3 and rng.random() < 0.6:
            mods.append(dict(fqn=name, parent=parent, is_leaf=False,
                             ops=random_ops(rng, rng.randrange(2, 7)) if rng.random() < 0.9 else None))
            pre.append(name)
            for _ in range(rng.randrange(1, 4)):
                add(name, depth + 1)
        else:
            mods.append(dict(fqn=name, parent=parent, is_leaf=True))
            pre.append(name)
        post.append(name)

    for _ in range(rng.randrange(2, 5)):
        add("R", 1)
    post.append("R")
    total = 0
    for m in mods:
        total += rng.randrange(0, 2048)
        m.update(act_total_bytes=total, act_grad_bytes=rng.randrange(0, 1024),
                 act_saved_bytes=rng.randrange(0, 4096) if m.get("ops") else 0,
                 grad_total_bytes=rng.randrange(0, 512), param_bytes=rng.randrange(0, 512))
    return Stats.model_validate(dict(metadata=dict(model_name="deep"), fw_pre_order=pre, fw_post_order=post,
                                     modules=mods))


@pytest.mark.slow
def test_dp_equals_milp_on_deeper_random_trees():
    rng = random.Random(5)
    for trial in range(30):
        stats = _deep_stats(rng)
        budget = rng.uniform(0.4, 1.0) * realize(stats, {})[0] / GIB
        dp, milp = plan(stats, budget, solver="dp"), plan(stats, budget, solver="milp", time_limit_s=30)
        assert dp.status == milp.status, f"trial {trial}"
        if dp.status == "optimal":
            assert dp.recompute_ms == pytest.approx(milp.recompute_ms, rel=1e-6, abs=1e-9), f"trial {trial}"
            peak, rc = realize(stats, {m.fqn: m.save for m in dp.modules})
            assert peak <= budget * GIB and rc == pytest.approx(dp.recompute_ms)
        else:
            assert dp.min_feasible_budget_gib == pytest.approx(milp.min_feasible_budget_gib, rel=1e-5)


@pytest.mark.slow
def test_l12_dp_optimum_lies_inside_the_milp_interval():
    """An independent engine's bracket: HiGHS's incumbent and proven bound on the same model."""
    stats = load_stats(L12)
    for budget in (7.013, 12.0):  # the hardest budgets of the benchmark's range
        dp = plan(stats, budget)
        milp = plan(stats, budget, solver="milp", time_limit_s=5)
        assert dp.status == "optimal" and dp.mip_gap <= 1e-6
        assert milp.status in ("optimal", "feasible")
        assert dp.recompute_ms <= milp.recompute_ms * (1 + 1e-6)
        assert dp.recompute_ms >= milp.recompute_ms * (1 - milp.mip_gap) * (1 - 1e-6)


def _large(stats: Stats, rng) -> Stats:
    """The same tree at real-model byte scales (units of 256 MiB, plus odd bytes), runtimes a microsecond apart."""
    doc = stats.model_dump(mode="json")
    for m in doc["modules"]:
        for k in ("act_total_bytes", "act_grad_bytes", "act_saved_bytes", "grad_total_bytes", "param_bytes"):
            m[k] = m[k] * 2**28 + rng.choice([0, 8, 16, 2**20])
        for op in m.get("ops") or []:
            op["output_bytes"] = op["output_bytes"] * 2**28 + rng.choice([0, 0, 8, 2**20])
            op["runtime_ms"] = rng.choice([0.0, 1.0, 1.0 + 1e-6, 2.5, 1e-6, 0.5])
    return Stats.model_validate(doc)


def test_milp_is_honest_at_budgets_equal_to_a_plans_peak():
    # HiGHS works to a tolerance of its memory unit, so on large byte values a budget
    # exactly at some plan's peak is where it can cut off the optimum. Whatever it says
    # must be true: 'optimal' equals brute force, 'feasible' carries a gap the brute-force
    # optimum respects, 'error' instead of a false 'infeasible'. The exact DP ('auto')
    # must get every one right.
    import itertools

    rng = random.Random(1)
    seen = {}
    for trial in range(60):
        stats = _large(random_stats(rng), rng)
        ws = rng.choice([1, 2])
        cands = [m for m in stats.modules if not m.is_leaf and m.ops]
        options = [[None] + [save for _, _, save in module_options(m)] for m in cands]
        peaks = []
        for choice in itertools.islice(itertools.product(*options), 0, None, 7):
            chosen = {m.fqn: s for m, s in zip(cands, choice) if s is not None}
            if not any(a != b and b.startswith(a + ".") for a in chosen for b in chosen):
                peaks.append(realize(stats, chosen, ws)[0])
        for budget in rng.sample(peaks, min(4, len(peaks))):
            want = brute_force(stats, budget, ws)
            q = plan(stats, budget / GIB, solver="milp", world_size=ws)
            seen[q.status] = seen.get(q.status, 0) + 1
            if q.status == "optimal":
                assert q.recompute_ms == pytest.approx(want, rel=1e-6, abs=1e-9), f"trial {trial}"
            elif q.status == "feasible":
                assert want >= q.recompute_ms * (1 - q.mip_gap) - 1e-9, f"trial {trial}: gap {q.mip_gap}"
            else:
                assert q.status == "error", f"trial {trial}: {q.status} but a plan costs {want}"
            if q.modules:
                assert realize(stats, {m.fqn: m.save for m in q.modules}, ws)[0] <= budget
            a = plan(stats, budget / GIB, world_size=ws)
            assert a.status == "optimal" and a.recompute_ms == pytest.approx(want, rel=1e-6, abs=1e-9)
    assert seen.get("optimal", 0) >= 100 and seen.get("feasible", 0) + seen.get("error", 0) >= 1


def test_a_sweep_shares_one_time_limit(l4):
    # 1 ns for the whole sweep: the analysis alone takes longer, so every budget that needs a plan comes back
    # time_limit without a solve, saying the one limit ran out; a budget the step fits as it is still has its
    # answer (no checkpointing), and per-budget limits (the old meaning) would have let each budget run its DP.
    baseline_gib = plan(l4, 1000.0).baseline_peak_bytes / GIB
    budgets = [4.5, 5.0, 5.5, math.ceil(baseline_gib) + 1.0]
    plans = sweep(l4, budgets, time_limit_s=1e-9)
    assert [p.status for p in plans[:3]] == ["time_limit"] * 3
    assert all("one time limit covers the whole call" in p.message for p in plans[:3])
    assert plans[3].status == "optimal" and plans[3].modules == []

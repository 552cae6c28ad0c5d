"""Op-level policy: known answers, brute force, and the SAC conventions."""

import itertools
import math
import random

import pytest

from planner import OpStats, module_frontier, optimal_op_policy

# PyTorch's TestOptimalCheckpointingPolicy (test/distributed/_tools/test_sac_ilp.py,
# seed 003 in ../shared/seeds), adapted from xformers; table in ../shared/reference/README.md.
KNOWN_OPS = dict(
    func_names=["aten.copy_", "aten.add", "aten.div", "aten.mm", "aten.native_dropout", "aten.linear", "aten.t",
                "aten.relu_"],
    runtimes=[5, 5, 8, 15, 15, 9, 1, 5],
    memory=[0, 100, 100, 120, 0, 100, 0, 0],
    view_like_ops=[6],
    rand_ops=[4],
    saved_autograd_ops=[],
    inplace_ops=[(0, 0), (7, 5)],
    force_store_random=False,
)
KNOWN_ANSWERS = [
    (0, [1, 0, 0, 0, 1, 0, 0, 0]),
    (100 / 420, [1, 0, 0, 0, 1, 1, 0, 1]),
    (120 / 420, [1, 0, 0, 1, 1, 0, 0, 0]),
    (200 / 420, [1, 0, 1, 0, 1, 1, 0, 1]),
    (220 / 420, [1, 0, 0, 1, 1, 1, 0, 1]),
    (320 / 420, [1, 0, 1, 1, 1, 1, 0, 1]),
    (420 / 420, [1, 1, 1, 1, 1, 1, 0, 1]),
]


@pytest.mark.parametrize("budget,expected", KNOWN_ANSWERS)
def test_known_answers_torch_dict(budget, expected):
    assert optimal_op_policy(KNOWN_OPS, budget) == expected


def _as_ops(d):
    parent = {op: p for op, p in d["inplace_ops"]}
    return [OpStats(name=n, runtime_ms=r, output_bytes=m, view_like=i in d["view_like_ops"],
                    random=i in d["rand_ops"], inplace_parent=parent.get(i))
            for i, (n, r, m) in enumerate(zip(d["func_names"], d["runtimes"], d["memory"]))]


@pytest.mark.parametrize("budget,expected", KNOWN_ANSWERS)
def test_known_answers_op_list(budget, expected):
    assert optimal_op_policy(_as_ops(KNOWN_OPS), budget) == expected


def _valid(ops, save, fsr=False):
    for i, op in enumerate(ops):
        if op.view_like and save[i]:
            return False
        if op.inplace_parent is not None:
            if op.inplace_parent == i and not save[i]:
                return False
            if save[i] != save[op.inplace_parent]:
                return False
            p = op.inplace_parent  # ops between a parent (not a view) and its mutation share its decision
            if p != i and not ops[p].view_like and any(save[k] != save[p] for k in range(p + 1, i)
                                                       if not ops[k].view_like):
                return False
    rand = [save[i] for i, op in enumerate(ops) if op.random]
    if fsr and not all(rand):
        return False
    return len(set(rand)) <= 1


def _random_ops(rng, n):
    ops = []
    for i in range(n):
        kind = rng.random()
        parent = None
        if kind < 0.15 and i > 0:
            parent = rng.randrange(i)
        elif kind < 0.2:
            parent = i
        ops.append(OpStats(
            name=f"op{i}", runtime_ms=rng.choice([0.0, 1.0, 2.5, 3.0, 7.0, rng.uniform(0, 9)]),
            output_bytes=rng.choice([0, 8, 100, 120, 256, rng.randrange(1, 500)]),
            view_like=(0.2 <= kind < 0.3) and parent is None, random=0.3 <= kind < 0.4,
            inplace_parent=parent))
    return ops


def _brute_force(ops, budget, fsr=False):
    cap = math.ceil(budget * sum(op.output_bytes for op in ops))
    best = None
    for save in itertools.product((0, 1), repeat=len(ops)):
        if not _valid(ops, save, fsr):
            continue
        mem = sum(op.output_bytes for op, s in zip(ops, save) if s)
        if mem > cap:
            continue
        ms = sum(op.runtime_ms for op, s in zip(ops, save) if s)
        if best is None or ms > best + 1e-9:
            best = ms
    return best


def test_policy_equals_brute_force_on_random_modules():
    rng = random.Random(1234)
    checked = refused = 0
    for trial in range(200):
        ops = _random_ops(rng, rng.randrange(1, 11))
        budget = rng.choice([0.0, 0.1, 0.3, 0.5, 0.77, 1.0])
        fsr = rng.random() < 0.3
        best = _brute_force(ops, budget, fsr)
        if best is None:  # nothing valid fits: the ops that must be saved alone exceed the budget
            with pytest.raises(ValueError, match=r"allows \d+ bytes but the ops that must be saved"):
                optimal_op_policy(ops, budget, force_store_random=fsr)
            refused += 1
            continue
        save = optimal_op_policy(ops, budget, force_store_random=fsr)
        assert _valid(ops, save, fsr)
        assert sum(op.output_bytes for op, s in zip(ops, save) if s) <= math.ceil(
            budget * sum(op.output_bytes for op in ops))
        assert sum(op.runtime_ms for op, s in zip(ops, save) if s) == pytest.approx(best, abs=1e-9)
        checked += 1
    assert checked > 100 and refused >= 5


def test_frontier_is_exactly_the_nondominated_set():
    rng = random.Random(99)
    for _ in range(60):
        ops = _random_ops(rng, rng.randrange(1, 10))
        fsr = rng.random() < 0.3
        points = set()
        for save in itertools.product((0, 1), repeat=len(ops)):
            if _valid(ops, save, fsr):
                points.add((sum(op.output_bytes for op, s in zip(ops, save) if s),
                            round(sum(op.runtime_ms for op, s in zip(ops, save) if s), 9)))
        nondominated = sorted(
            (b, ms) for b, ms in points
            if not any((b2 <= b and ms2 >= ms) and (b2, ms2) != (b, ms) for b2, ms2 in points))
        # Equal-runtime points at more bytes are dominated; keep the cheapest per runtime.
        f = module_frontier(ops, fsr)
        got = [(int(b), round(float(ms), 9)) for b, ms in zip(f.saved_bytes, f.saved_ms)]
        assert got == nondominated
        for k in range(len(f)):
            save = f.save_list(k)
            assert _valid(ops, save, fsr)
            assert sum(op.output_bytes for op, s in zip(ops, save) if s) == f.saved_bytes[k]


def test_force_store_random_saves_every_random_op():
    ops = _as_ops(KNOWN_OPS)
    ops[4] = ops[4].model_copy(update={"output_bytes": 50})
    assert optimal_op_policy(ops, 0.0, force_store_random=False)[4] == 0
    assert optimal_op_policy(ops, 0.2, force_store_random=True)[4] == 1


@pytest.mark.parametrize("budget", [-0.1, 1.5, float("nan")])
def test_budget_out_of_range(budget):
    with pytest.raises(ValueError, match="memory_budget must be a fraction"):
        optimal_op_policy(KNOWN_OPS, budget)


def test_contradictory_rules_are_named():
    ops = [OpStats(name="aten.view", runtime_ms=0, output_bytes=0, view_like=True),
           OpStats(name="aten.add_", runtime_ms=1, output_bytes=0, inplace_parent=1),
           OpStats(name="aten.mul_", runtime_ms=1, output_bytes=0, inplace_parent=0)]
    ops[0] = ops[0].model_copy(update={"inplace_parent": 0})
    with pytest.raises(ValueError, match="contradictory SAC rules"):
        optimal_op_policy(ops, 0.5)


@pytest.mark.parametrize("edit,match", [
    (dict(inplace_ops=[(7, 91)]), r"inplace_ops\[0\] parent 91 is out of range for 8 ops"),
    (dict(inplace_ops=[(9, 0)]), r"inplace_ops\[0\] op 9 is out of range for 8 ops"),
    (dict(inplace_ops=[(7,)]), r"inplace_ops\[0\] \(7,\) is not an \[op, parent\] pair"),
    (dict(runtimes=[1.0, 2.0]), r"runtimes has 2 entries but func_names has 8"),
    (dict(memory=None), r"memory is missing"),
    (dict(view_like_ops=[8]), r"view_like_ops\[0\] 8 is out of range for 8 ops"),
    (dict(saved_autograd_ops=[-1]), r"saved_autograd_ops\[0\] -1 is out of range for 8 ops"),
])
def test_torch_dict_errors_are_named(edit, match):
    with pytest.raises(ValueError, match=match):
        optimal_op_policy(dict(KNOWN_OPS, **edit), 0.5)


def test_an_op_between_a_saved_output_and_its_mutation_shares_its_decision():
    """Mixtral's router: top-k weights (op 0) summed (op 1), then divided in place (op 2). Recomputing the sum
    while the top-k output is saved reads the divided weights SAC cached (seen: gradients 1e-3 off in
    tests/estimators/apply/test_apply_anywhere.py); so the three share one decision, and a view between them does not."""
    from planner.ops.groups import op_groups

    ops = [OpStats(name="aten.topk", runtime_ms=1, output_bytes=64),
           OpStats(name="aten.sum", runtime_ms=1, output_bytes=8),
           OpStats(name="aten.view", runtime_ms=0, output_bytes=0, view_like=True),
           OpStats(name="aten.div_", runtime_ms=1, output_bytes=0, inplace_parent=0)]
    groups = op_groups(ops)
    assert (0, 1, 3) in groups.members and (2,) in groups.members

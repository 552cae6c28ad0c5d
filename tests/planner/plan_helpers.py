"""Helpers shared by the planner tests: an independent evaluator, random ops, brute force."""

import itertools

from planner import Stats


# --- an evaluator written from docs/memory-model.md, independent of the planner ---

def realize(stats: Stats, decisions: dict[str, list[int]], world_size: int = 1, *,
            first_step_only: bool = False, reserve_bytes: float = 0.0) -> tuple[float, float]:
    """(peak bytes, recompute ms) of per-module save lists, from the raw stats.

    With a timeline: the step's moments; a discard counts at a moment when its module's
    post-order position is below the moment's key. Without: PyTorch's per-module formula.
    The optimizer state counts at every moment unless ``first_step_only`` (docs/memory-model.md).
    """
    post = {f: k for k, f in enumerate(stats.fw_post_order)}
    mods = {m.fqn: m for m in stats.modules}
    root = mods[stats.fw_pre_order[0]]
    state = 0 if first_step_only else root.optimizer_state_bytes
    discard, recompute = {}, 0.0
    for fqn, save in decisions.items():
        m = mods[fqn]
        assert len(save) == len(m.ops)
        # checkpointing keeps the inputs it holds alive: they offset what it frees
        discard[fqn] = m.act_saved_bytes - m.held_input_bytes - sum(op.output_bytes for op, s in zip(m.ops, save) if s)
        per_call = sum(op.runtime_ms for op, s in zip(m.ops, save) if not s) + (m.checkpoint_overhead_ms or 0.0)
        recompute += per_call * m.calls  # every call of a shared module is recomputed
    if stats.timeline:
        moments = [(t.activation_bytes + (root.param_bytes + t.grad_bytes
                                          + (t.optimizer_bytes if t.phase == "optimizer" else state)) / world_size,
                    t.key, t.phase, t.repeat_calls_discarding, t.repeat_calls_in_backward) for t in stats.timeline]
    else:
        moments = [(m.act_total_bytes + m.act_grad_bytes + (root.param_bytes + state + m.grad_total_bytes) / world_size,
                    post[m.fqn], "module", {}, {}) for m in stats.modules]

    def held(fqn: str, key: int, phase: str) -> int:
        # the inputs a checkpointed module holds, through its own backward: keys of its subtree's positions
        inside = [post[f] for f in post if f == fqn or f.startswith(fqn + ".")]
        return mods[fqn].held_input_bytes if phase == "backward" and min(inside) <= key <= post[fqn] else 0

    # a module's later calls: each discards as the first over its own span, and holds its inputs in its backward
    peak = max(base + reserve_bytes - sum(d * ((post[f] < key) + later.get(f, 0)) for f, d in discard.items())
               + sum(held(f, key, phase) + mods[f].held_input_bytes * in_bw.get(f, 0) for f in discard)
               for base, key, phase, later, in_bw in moments)
    return peak, recompute


def check_plan(stats: Stats, p, world_size: int = 1, **terms) -> None:
    """Everything a plan reports, re-derived from its save lists and the raw stats (``terms``: as for realize)."""
    assert p.status in ("optimal", "feasible"), p.message
    mods = {m.fqn: m for m in stats.modules}
    fqns = [m.fqn for m in p.modules]
    assert len(set(fqns)) == len(fqns)
    assert not any(a != b and b.startswith(a + ".") for a in fqns for b in fqns), "nested checkpoints"
    for pm in p.modules:
        m = mods[pm.fqn]
        assert not m.is_leaf and m.ops, f"{pm.fqn} cannot be checkpointed"
        assert valid_save(m.ops, pm.save, m.force_store_random), pm.fqn
        assert pm.op_names == [op.name for op in m.ops]
        saved = sum(op.output_bytes for op, s in zip(m.ops, pm.save) if s)
        assert pm.saved_bytes == saved
        assert pm.discarded_bytes == m.act_saved_bytes - m.held_input_bytes - saved
        total = sum(op.output_bytes for op in m.ops)
        assert abs(pm.discard_ratio - (1 - saved / total if total else 0.0)) <= 1e-12
        rc = (sum(op.runtime_ms for op, s in zip(m.ops, pm.save) if not s) + (m.checkpoint_overhead_ms or 0.0)) * m.calls
        assert abs(pm.recompute_ms - rc) <= 1e-9 * max(1.0, rc), pm.fqn
    peak, rc = realize(stats, {pm.fqn: pm.save for pm in p.modules}, world_size, **terms)
    assert peak - 1e-6 <= p.peak_bytes < peak + 1 + 1e-6  # the model's peak, rounded up to whole bytes
    assert peak <= p.memory_budget_gib * 2**30
    assert abs(p.recompute_ms - rc) <= 1e-6 * rc + 1e-12
    baseline = realize(stats, {}, world_size, **terms)[0]
    assert baseline - 1e-6 <= p.baseline_peak_bytes < baseline + 1 + 1e-6


def valid_save(ops, save, fsr=False):
    for i, op in enumerate(ops):
        if op.view_like and save[i]:
            return False
        p = op.inplace_parent
        if p is not None and ((p == i and not save[i]) or save[i] != save[p]):
            return False
        # an op between the parent and its in-place mutation may read the unmutated output: same decision
        # an op between a parent (not a view) and its in-place mutation may read the unmutated output: it
        # shares the parent's decision
        if p is not None and p != i and not ops[p].view_like and any(save[k] != save[p] for k in range(p + 1, i)
                                                                      if not ops[k].view_like):
            return False
    rand = {save[i] for i, op in enumerate(ops) if op.random}
    return len(rand) <= 1 and (not fsr or rand <= {1})


def random_ops(rng, n):
    """n random ops: views, random ops and in-place ops among them."""
    out = []
    for i in range(n):
        r = rng.random()
        out.append(dict(name=f"aten.op{i}", runtime_ms=round(rng.uniform(0, 5), 3),
                        output_bytes=rng.choice([0, 64, 128, 256, 512, 1024]),
                        view_like=r < 0.1, random=0.1 <= r < 0.2,
                        inplace_parent=(rng.randrange(i) if (0.2 <= r < 0.3 and i) else None)))
    return out


def module_options(m) -> list[tuple[int, float, list[int]]]:
    """Every valid save list of one module, by exhaustive enumeration, reduced to the non-dominated
    (discarded bytes, recompute ms) pairs: no other list discards at least as much for no more recompute.
    Written from the conventions in ../shared/reference/README.md, without the planner's frontier code."""
    found = []
    for save in itertools.product((0, 1), repeat=len(m.ops)):
        if not valid_save(m.ops, save, m.force_store_random):
            continue
        kept = sum(op.output_bytes for op, s in zip(m.ops, save) if s)
        rc = sum(op.runtime_ms for op, s in zip(m.ops, save) if not s)
        found.append((m.act_saved_bytes - m.held_input_bytes - kept, rc, list(save)))
    found.sort(key=lambda x: (-x[0], x[1]))
    out, cheapest = [], float("inf")
    for d, rc, save in found:  # by discard, most first: keep a list only if it is cheaper than every larger one
        if rc < cheapest - 1e-12:
            out.append((d, rc, save))
            cheapest = rc
    return out


def brute_force(stats: Stats, budget_bytes: float, world_size: int = 1, **terms):
    """Least recompute over every non-nested choice of valid save lists (None if infeasible)."""
    cands = [m for m in stats.modules if not m.is_leaf and m.ops]
    options = [[None] + [save for _, _, save in module_options(m)] for m in cands]
    best = None
    for choice in itertools.product(*options):
        chosen = {m.fqn: s for m, s in zip(cands, choice) if s is not None}
        if any(a != b and b.startswith(a + ".") for a in chosen for b in chosen):
            continue
        peak, rc = realize(stats, chosen, world_size, **terms)
        if peak <= budget_bytes and (best is None or rc < best - 1e-9):
            best = rc
    return best

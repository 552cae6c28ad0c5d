"""Helpers shared by the planner tests: an independent evaluator, random ops, brute force."""

import itertools

from planner import Stats, module_frontier


# --- an evaluator written from docs/memory-model.md, independent of the planner ---

def realize(stats: Stats, decisions: dict[str, list[int]], world_size: int = 1) -> tuple[float, float]:
    """(peak bytes, recompute ms) of per-module save lists, from the raw stats."""
    post = {f: k for k, f in enumerate(stats.fw_post_order)}
    mods = {m.fqn: m for m in stats.modules}
    root = mods[stats.fw_pre_order[0]]
    discard, recompute = {}, 0.0
    for fqn, save in decisions.items():
        ops = mods[fqn].ops
        assert len(save) == len(ops)
        discard[fqn] = mods[fqn].act_saved_bytes - sum(op.output_bytes for op, s in zip(ops, save) if s)
        recompute += sum(op.runtime_ms for op, s in zip(ops, save) if not s)
    peak = max(
        m.act_total_bytes + m.act_grad_bytes + (root.param_bytes + m.grad_total_bytes) / world_size
        - sum(d for f, d in discard.items() if post[f] < post[m.fqn])
        for m in stats.modules
    )
    return peak, recompute


def valid_save(ops, save, fsr=False):
    for i, op in enumerate(ops):
        if op.view_like and save[i]:
            return False
        p = op.inplace_parent
        if p is not None and ((p == i and not save[i]) or save[i] != save[p]):
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


def brute_force(stats: Stats, budget_bytes: float, world_size: int = 1):
    """Least recompute over every non-nested choice of frontier points (None if infeasible)."""
    cands = [m for m in stats.modules if not m.is_leaf and m.ops]
    options = []
    for m in cands:
        f = module_frontier(m.ops, m.force_store_random)
        options.append([None] + [f.save_list(k) for k in range(len(f))])
    best = None
    for choice in itertools.product(*options):
        chosen = {m.fqn: s for m, s in zip(cands, choice) if s is not None}
        if any(a != b and b.startswith(a + ".") for a in chosen for b in chosen):
            continue
        peak, rc = realize(stats, chosen, world_size)
        if peak <= budget_bytes and (best is None or rc < best - 1e-9):
            best = rc
    return best

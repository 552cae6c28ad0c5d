"""Offloading's test helpers: random stacks, an evaluator written from the rules of issue 31 (not from the
planner's code), and brute force over every save / recompute / offload choice of every op.

The rules (the issue's shared interface): windows are the blocks ``R.L.0`` .. ``R.L.{m-1}`` plus a last window
(the rest, ending with the root); block j's offloaded bytes are off the device at every moment whose key is at
least ``post(R.L.{j+1}) + 1`` (the last block: ``post(R) + 1``); nothing after the last block offloads. Stall of
block j: ``max(0, O_j / d2h - F) + max(0, O_j / h2d - G)`` with F, G the next window's forward and backward
compute (the next block's ``fw_ms``/``bw_ms``; after the last block: the root's less the blocks' and R.emb's).
A checkpointed module's discard counts its offloaded ops as saved, and must not be negative; it is
checkpointed only if it discards or offloads something. An op may be offloaded when it is saved, has bytes and
is not view-like.
"""

from __future__ import annotations

import itertools

import numpy as np

from planner import Stats

__all__ = ["random_stack", "evaluate", "brute_force_offload", "finish_stack"]


def _ops(rng, n):
    out = []
    for i in range(n):
        view = i > 0 and rng.random() < 0.15  # the first op is not a view: every block is a candidate
        out.append(dict(name=f"aten.op{i}", runtime_ms=0.0 if view else round(rng.uniform(0.05, 3), 3),
                        output_bytes=0 if view else rng.choice([64, 128, 256, 512, 1024]), view_like=view))
    return out


def random_stack(rng, blocks: int) -> Stats:
    """R: R.emb (leaf), R.L with ``blocks`` blocks (each with ops; some holding a sub-module with ops), R.head.

    Every block is a candidate (it frees memory when checkpointed), so R.L is the widest module: its blocks are
    the windows."""
    mods = [dict(fqn="R", parent=None, is_leaf=False), dict(fqn="R.emb", parent="R", is_leaf=True),
            dict(fqn="R.L", parent="R", is_leaf=False)]
    pre, post = ["R", "R.emb", "R.L"], ["R.emb"]
    for j in range(blocks):
        b = f"R.L.{j}"
        mods.append(dict(fqn=b, parent="R.L", is_leaf=False, ops=_ops(rng, rng.choice([2, 3]))))
        pre.append(b)
        if j < 2 and rng.random() < 0.4:  # a nested candidate: the chain rule matters
            mods += [dict(fqn=b + ".a", parent=b, is_leaf=False, ops=_ops(rng, 2)),
                     dict(fqn=b + ".a.x", parent=b + ".a", is_leaf=True)]
            pre += [b + ".a", b + ".a.x"]
            post += [b + ".a.x", b + ".a"]
        else:
            mods.append(dict(fqn=b + ".x", parent=b, is_leaf=True))
            pre.append(b + ".x")
            post.append(b + ".x")
        post.append(b)
    mods.append(dict(fqn="R.head", parent="R", is_leaf=True))
    pre.append("R.head")
    post += ["R.L", "R.head", "R"]
    for m in mods:
        if m.get("ops"):
            op_bytes = sum(op["output_bytes"] for op in m["ops"])
            m["act_saved_bytes"] = op_bytes + rng.choice([0, 0, 128])
            if rng.random() < 0.3:
                m["held_input_bytes"] = rng.choice([32, 64])
        if m["fqn"].count(".") == 2 or m["fqn"] in ("R.emb", "R.head"):
            m["fw_ms"], m["bw_ms"] = round(rng.uniform(0.2, 2), 3), round(rng.uniform(0.4, 4), 3)
    by = {m["fqn"]: m for m in mods}
    by["R"]["fw_ms"] = sum(m.get("fw_ms", 0.0) for m in mods) + 0.5
    by["R"]["bw_ms"] = sum(m.get("bw_ms", 0.0) for m in mods) + 0.5
    n = len(mods)
    timeline = [dict(phase="forward", key=k, activation_bytes=1000 + 300 * k + rng.randrange(0, 400))
                for k in range(n + 1)]
    timeline += [dict(phase="backward", key=k, activation_bytes=1500 + 300 * k + rng.randrange(0, 400),
                      grad_bytes=rng.randrange(0, 200)) for k in range(n, -1, -1)]
    timeline.append(dict(phase="optimizer", key=0, activation_bytes=0, grad_bytes=100))
    return Stats.model_validate(dict(metadata=dict(model_name="offload-stack"), fw_pre_order=pre,
                                     fw_post_order=post, modules=mods, timeline=timeline))


def _windows(stats: Stats):
    """Per block j: (credit key, next window's forward ms, backward ms); and fqn -> its block (None: none)."""
    post = {f: k for k, f in enumerate(stats.fw_post_order)}
    mods = {m.fqn: m for m in stats.modules}
    blocks = [f for f in stats.fw_pre_order if f.count(".") == 2 and f.startswith("R.L.")]
    out = []
    for j in range(len(blocks)):
        if j + 1 < len(blocks):
            nxt = mods[blocks[j + 1]]
            out.append((post[blocks[j + 1]] + 1, nxt.fw_ms, nxt.bw_ms))
        else:
            rest = [mods["R.emb"]] + [mods[b] for b in blocks]
            out.append((post["R"] + 1, mods["R"].fw_ms - sum(m.fw_ms for m in rest),
                        mods["R"].bw_ms - sum(m.bw_ms for m in rest)))
    block_of = {f: next((j for j, b in enumerate(blocks) if f == b or f.startswith(b + ".")), None) for f in mods}
    return out, block_of


def _moments(stats: Stats):
    root = stats.modules[0]
    state = root.optimizer_state_bytes
    t = stats.timeline
    base = np.array([m.activation_bytes + root.param_bytes + m.grad_bytes
                     + (m.optimizer_bytes if m.phase == "optimizer" else state) for m in t], dtype=float)
    return base, np.array([m.key for m in t]), np.array([m.phase == "backward" for m in t])


def _effect(stats: Stats, fqn: str, save, offload, keys, backward, windows, block_of, gbps):
    """(memory freed per moment, recompute ms, block, offloaded bytes) of one checkpointed module."""
    post = {f: k for k, f in enumerate(stats.fw_post_order)}
    m = next(x for x in stats.modules if x.fqn == fqn)
    d = m.act_saved_bytes - m.held_input_bytes - sum(op.output_bytes for op, s in zip(m.ops, save) if s)
    o = sum(op.output_bytes for op, f in zip(m.ops, offload) if f)
    inside = [post[f] for f in post if f == fqn or f.startswith(fqn + ".")]
    freed = d * (post[fqn] < keys) - m.held_input_bytes * (backward & (min(inside) <= keys) & (keys <= post[fqn]))
    if o:
        freed = freed + o * (keys >= windows[block_of[fqn]][0])
    rc = sum(op.runtime_ms for op, s in zip(m.ops, save) if not s) + (m.checkpoint_overhead_ms or 0.0)
    return freed.astype(float), rc, block_of[fqn], o, d


def _stall(windows, per_block, gbps):
    bpm = gbps * 1e6  # bytes per ms
    return sum(max(0.0, o / bpm - fw) + max(0.0, o / bpm - bw) for (_, fw, bw), o in zip(windows, per_block))


def evaluate(stats: Stats, plan_modules, gbps: float) -> tuple[float, float, float]:
    """(peak bytes, recompute ms, stall ms) of a plan's modules (fqn, save, offload or None), from the raw stats."""
    windows, block_of = _windows(stats)
    base, keys, backward = _moments(stats)
    freed = np.zeros(len(base))
    rc, per_block = 0.0, [0.0] * len(windows)
    for fqn, save, offload in plan_modules:
        offload = offload or [0] * len(save)
        f, r, b, o, _ = _effect(stats, fqn, save, offload, keys, backward, windows, block_of, gbps)
        assert not o or b is not None, f"{fqn} offloads outside the blocks"
        assert all(s for s, x in zip(save, offload) if x), f"{fqn} offloads an op it does not save"
        freed += f
        rc += r
        if o:
            per_block[b] += o
    return float((base - freed).max()), rc, _stall(windows, per_block, gbps)


def _options(stats, m, keys, backward, windows, block_of, gbps):
    """Every distinct (freed per moment, recompute, block, offload) of module m: its valid choices per op."""
    seen, out = set(), []
    can_off = block_of[m.fqn] is not None
    for choice in itertools.product((0, 1, 2), repeat=len(m.ops)):  # 0 recompute, 1 save, 2 offload
        if any(op.view_like and c != 0 for op, c in zip(m.ops, choice)):
            continue  # views are recomputed
        if any(c == 2 and (not can_off or op.output_bytes == 0) for op, c in zip(m.ops, choice)):
            continue
        save = [int(c > 0) for c in choice]
        offload = [int(c == 2) for c in choice]
        f, r, b, o, d = _effect(stats, m.fqn, save, offload, keys, backward, windows, block_of, gbps)
        if d < 0 or (d == 0 and o == 0):
            continue
        key = (tuple(f.tolist()), round(r, 9), o)
        if key not in seen:
            seen.add(key)
            out.append((f, r, b, o))
    return out


def brute_force_offload(stats: Stats, budget_bytes: float, gbps: float,
                        host_budget_bytes: float | None = None) -> float | None:
    """Least recompute + stall over every non-nested choice (None if nothing fits), offloading at most
    ``host_budget_bytes`` in all when given."""
    windows, block_of = _windows(stats)
    base, keys, backward = _moments(stats)
    cands = [m for m in stats.modules if m.ops]
    opts = [[None] + _options(stats, m, keys, backward, windows, block_of, gbps) for m in cands]
    best = None
    for combo in itertools.product(*opts):
        chosen = [m.fqn for m, c in zip(cands, combo) if c is not None]
        if any(a != b and b.startswith(a + ".") for a in chosen for b in chosen):
            continue
        freed, rc, per_block = np.zeros(len(base)), 0.0, [0.0] * len(windows)
        for c in combo:
            if c is not None:
                freed = freed + c[0]
                rc += c[1]
                if c[3]:
                    per_block[c[2]] += c[3]
        if host_budget_bytes is not None and sum(per_block) > host_budget_bytes:
            continue
        if (base - freed).max() <= budget_bytes:
            cost = rc + _stall(windows, per_block, gbps)
            if best is None or cost < best:
                best = cost
    return best


def finish_stack(mods: list, pre: list, post: list, *, blocks: int, fw: float, bw: float, keys: int, per_key: int,
                 name: str) -> Stats:
    """The stats of a stack R: R.emb, R.L (its ``blocks`` blocks already in ``mods``/``pre``/``post``), then R.head
    added here; the root's times; a timeline where each block's ``keys`` module keys add ``per_key`` bytes each (the
    needs grow alike, as in a real decoder), the backward 500 bytes above the forward and 2000 more around the loss."""
    mods.append(dict(fqn="R.head", parent="R", is_leaf=True, fw_ms=1.0, bw_ms=2.0))
    pre.append("R.head")
    post += ["R.L", "R.head", "R"]
    mods[0].update(fw_ms=0.3 + blocks * fw + 1.5, bw_ms=0.5 + blocks * bw + 2.5)
    n = len(mods)
    step = keys * per_key  # what a block adds
    timeline = [dict(phase="forward", key=k, activation_bytes=1000 + step * k // keys) for k in range(n + 1)]
    timeline += [dict(phase="backward", key=k, activation_bytes=1500 + step * k // keys + (2000 if k == n - 1 else 0))
                 for k in range(n, -1, -1)]
    timeline.append(dict(phase="optimizer", key=0, activation_bytes=0))
    return Stats.model_validate(dict(metadata=dict(model_name=name), fw_pre_order=pre, fw_post_order=post,
                                     modules=mods, timeline=timeline))

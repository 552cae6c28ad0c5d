"""One block's options for the ordered relaxation (:mod:`planner.solve.stack.ordered`), and what each requires.

A joint option of a block (a point per chosen candidate of its subtree) is
kept here with its *partial* discards: how much it has freed before each of
the block's own keys, and which of its candidates, checkpointed, hold their
inputs through their own backward (``problem.held_needs``). From them and
the needs of a budget, :func:`requirements` gives each option's R: the
slack the discard before a block must leave for that option to meet every
constraint of the block (see :mod:`planner.solve.stack.ordered`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from planner.memory_model import NEED_TOL_BYTES
from planner.solve.problem import Frontiers

__all__ = ["BlockTypes", "back_to_back", "block_types", "held_table", "partial_table", "requirements"]

_MAX_OPTIONS = 20_000  # options of one block the ordered relaxation will list


@dataclass(frozen=True)
class BlockTypes:
    """Budget-independent: one block's options for the ordered relaxation, with their partial discards.

    Unlike the plain relaxation's options (non-dominated in total discard and
    recompute only), these keep every option that no other beats on total
    discard, recompute *and* the discard finished before each of the block's
    own keys: an option that frees less in all but frees it earlier can be
    what a tight budget needs.
    """

    d: np.ndarray  # total discard per option (int64 bytes)
    rc: np.ndarray  # recompute ms
    partial: np.ndarray  # (options, keys): discard finished before each key of the block
    choices: list  # per option: (candidate, point) pairs, relative to the first block
    n_keys: int  # keys from the block's start to its root
    held: tuple = ()  # candidates of the first block that hold their inputs when checkpointed
    holds: np.ndarray | None = None  # (options, len(held)) bool: which of them the option checkpoints


def block_types(fr: Frontiers, stack, max_options: int = _MAX_OPTIONS, held: tuple = ()) -> BlockTypes | None:
    """The ordered relaxation's options of one block; None when the blocks are not back to back or too many.

    ``held``: candidates of the first block that, checkpointed, hold their
    inputs through their own backward (a need on the discard finished before
    their subtree, met only by the blocks before: ``problem.held_needs``). An
    option that checkpoints one of them is then no substitute for one that
    does not, so dominance counts them as one more (negated) column each.
    """
    if not back_to_back(fr, stack):
        return None
    rep = stack.blocks[0]
    keys = np.arange(fr.starts[rep], rep + 1)
    try:
        d, rc, part, choices = _profile_options(fr, rep, keys, tuple(held), max_options)
    except _TooMany:
        return None
    return BlockTypes(d.astype(np.int64), rc, part[:, :len(keys)], choices, len(keys), tuple(held),
                      part[:, len(keys):] < 0)


def back_to_back(fr: Frontiers, stack) -> bool:
    """Whether each block starts right after the one before: else something sits between two blocks, and
    their positions are not interchangeable."""
    return all(fr.starts[nxt] == prev + 1 for prev, nxt in zip(stack.blocks, stack.blocks[1:]))


def partial_table(fr, stack, choices: list) -> np.ndarray:
    """Partial discards (options, keys) of arbitrary joint options of the first block."""
    rep = stack.blocks[0]
    keys = np.arange(fr.starts[rep], rep + 1)
    out = np.zeros((len(choices), len(keys)))
    for p, choice in enumerate(choices):
        for i, j in choice:
            out[p, keys > i] += float(fr.d[i][j])
    return out


def held_table(choices: list, held: tuple) -> np.ndarray:
    """(options, len(held)) bool: which of the candidates ``held`` each joint option of the first block checkpoints."""
    out = np.zeros((len(choices), len(held)), bool)
    for p, choice in enumerate(choices):
        for i, _ in choice:
            if i in held:
                out[p, held.index(i)] = True
    return out


class _TooMany(Exception):
    pass


def _profile_options(fr, c: int, keys: np.ndarray, held: tuple, limit: int):
    """Options of c's subtree no other beats on discard, recompute and every partial discard.

    The partial discards come with one column per candidate of ``held``: -1 where the option checkpoints it
    (more is better, as for the discards: an option holding inputs no other holds is never dropped for it).
    """
    width = len(keys) + len(held)
    d, rc, part, ch = np.zeros(1), np.zeros(1), np.zeros((1, width)), [()]
    k = c - 1
    while k >= fr.starts[c]:  # children, last first; a dominating child option dominates in any combination
        cd, crc, cpart, cch = _profile_options(fr, k, keys, held, limit)
        if len(d) * len(cd) > 50 * limit:
            raise _TooMany
        d = (d[:, None] + cd[None, :]).ravel()
        rc = (rc[:, None] + crc[None, :]).ravel()
        part = (part[:, None, :] + cpart[None, :, :]).reshape(-1, width)
        ch = [p + q for p in ch for q in cch]
        d, rc, part, ch = _undominated(d, rc, part, ch, limit)
        k = fr.starts[k] - 1
    own = np.asarray(fr.d[c], dtype=np.float64)
    own_part = np.zeros((len(own), width))
    own_part[:, :len(keys)] = own[:, None] * (keys[None, :] > c)  # c's discard counts from the key after it
    if c in held:
        own_part[:, len(keys) + held.index(c)] = -1.0
    d = np.concatenate([d, own])
    rc = np.concatenate([rc, np.asarray(fr.rc[c], dtype=np.float64)])
    part = np.concatenate([part, own_part])
    ch = ch + [((c, j),) for j in range(len(own))]
    return _undominated(d, rc, part, ch, limit)


def _undominated(d, rc, part, ch, limit):
    """Drop options another beats (or equals) on more discard, less recompute and more discard at every key."""
    order = np.lexsort((-part.sum(axis=1), -d, rc))  # cheapest first; among equals the most discard first
    cols = np.vstack([d, part.T])  # (1 + keys, options): one row per compared quantity
    kept_cols = np.empty((cols.shape[0], len(order)))  # the kept options' columns, filled in order
    kept: list[int] = []
    for i in order.tolist():
        v, m = cols[:, i], len(kept)
        if m:
            beats = kept_cols[0, :m] >= v[0]
            for r in range(1, len(v)):
                beats &= kept_cols[r, :m] >= v[r]
            if beats.any():
                continue  # a cheaper-or-equal kept option discards at least as much everywhere
        kept_cols[:, m] = v
        kept.append(i)
        if len(kept) > limit:
            raise _TooMany
    kept = np.array(kept, dtype=np.int64)
    return d[kept], rc[kept], part[kept], [ch[i] for i in kept]


def requirements(fr, stack, partial: np.ndarray, need: np.ndarray, n: int, held_need: dict | None = None,
                 held: tuple = (), holds: np.ndarray | None = None,
                 lead: int | None = 0) -> tuple[np.ndarray, float, np.ndarray]:
    """(R per option, delta, lead R) for the first n member blocks at these needs; ``partial``: (options, keys).

    ``held_need`` (candidate -> threshold, ``problem.held_needs``) with ``held`` (candidates of the first
    block) and ``holds`` (options, len(held)): an option checkpointing h of block j also needs the discard
    before h's subtree, the block's discard before that key included, to reach h's threshold there.

    ``lead``: how many first blocks keep their own R (the third array, (lead, options)); the rest share R,
    the least over them, and delta is their growth. ``None``: as many as are looser than every block after
    them at every key (:func:`_lead_blocks`): the min over j would otherwise be theirs, and R as loose.
    """
    starts = np.array([fr.starts[b] for b in stack.blocks[:n]])
    block_need = need[starts[:, None] + np.arange(partial.shape[1])[None, :]]  # (n, keys)
    # R_p(j) = max_q need(j, q) - partial_p(q) - j delta; the relaxation keeps min over j (past the lead)
    req = np.max(block_need[None, :, :] - partial[:, None, :], axis=2)
    rep = stack.blocks[0]
    for col, h in enumerate(held):
        v = np.array([(held_need or {}).get(h + b - rep, -math.inf) for b in stack.blocks[:n]])
        if holds is None or not holds[:, col].any() or not np.isfinite(v).any():
            continue
        q = fr.starts[h] - fr.starts[rep]  # h's subtree start, relative to the block's
        rows = np.flatnonzero(holds[:, col])
        req[rows] = np.maximum(req[rows], v[None, :] - partial[rows, q][:, None])
    lead = _lead_blocks(block_need) if lead is None else lead
    first = block_need[lead:, 0]
    delta = float(first[-1] - first[0]) / (len(first) - 1) if len(first) > 1 else 0.0
    req -= delta * np.arange(n)[None, :]
    return req[:, lead:].min(axis=1), delta, req[:, :lead].T


_MAX_LEAD = 2


def _lead_blocks(block_need: np.ndarray) -> int:
    """How many first blocks are looser than every block after them at every key, after the growth of those.

    Llama-3 405B FSDP2 stats: the first layer starts 11.5 GiB below the second, every later one 5.6 GiB
    above the one before; with the first layer among them, every R lay 5.9 GiB under the other layers' own.
    """
    lead = 0
    while lead < min(_MAX_LEAD, len(block_need) - 3):
        rest = block_need[lead + 1:]
        delta = float(rest[-1, 0] - rest[0, 0]) / (len(rest) - 1)
        shifted = rest - delta * np.arange(1, len(rest) + 1)[:, None]
        if not np.all(block_need[lead] < shifted.min(axis=0) - NEED_TOL_BYTES):
            break
        lead += 1
    return lead

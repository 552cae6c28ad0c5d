"""The module-level problem: candidates, their frontiers and the memory needs, built once per request.

Every engine reads the same model. Candidate c (a non-leaf module with op
stats that frees memory when checkpointed, and that the request allows) is
either left alone or checkpointed at one point of its frontier: it then
discards ``d`` bytes (autograd-saved bytes minus what its policy keeps) and
recomputes ``rc`` ms. Module n's memory (:mod:`planner.memory_model`) falls
by every discard of the candidates finishing before it in forward
post-order, so "peak <= budget" is one need per *key* (how many candidates
have finished): ``sum of discards before key k >= need_k``. Candidates on one
root-to-leaf chain may not both be checkpointed.
"""

from __future__ import annotations

import math
from collections import Counter
from operator import attrgetter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner.memory_model import MemoryModel, discardable_bytes, memory_model
from planner.ops.frontier import Frontier, FrontierTooLarge, frontier_hull, module_frontier
from planner.ops.groups import OpGroups, op_groups
from planner.ops.knapsack import GroupClasses, group_classes
from planner.solve.points import hull_vertices, lower_hull
from planner.stats.format import ModuleStats, Stats

__all__ = ["FRONTIER_ITEMS", "FRONTIER_LIMIT", "Candidate", "Frontiers", "Problem", "held_needs", "key_needs",
           "need_rows", "prepare"]

# Frontiers up to this many points are listed; larger modules use the exact
# per-module knapsack MILP to land on a non-dominated point.
FRONTIER_LIMIT = 50_000
# Modules with more free op groups than this (one spanning a whole model) are
# not even tried: listing such a frontier up to the limit costs seconds, and
# it would overflow anyway (a 48-layer Llama's decoder: 2185 groups, 1.5 s).
FRONTIER_ITEMS = 1024


@dataclass(frozen=True)
class Candidate:
    """A module that may be checkpointed, with its op groups bucketed into classes."""

    fqn: str
    post_pos: int
    act_saved_bytes: int  # IA less the inputs checkpointing holds (memory_model.discardable_bytes)
    classes: GroupClasses
    ops_key: tuple = ()
    overhead_ms: float = 0.0  # checkpointing's own cost, paid whenever the module is checkpointed
    calls: int = 1  # forward calls in the step: each is recomputed

    def cost(self, recomputed_ms):
        """What checkpointing the module costs when its ops recompute ``recomputed_ms`` per call."""
        return (recomputed_ms + self.overhead_ms) * self.calls

    @property
    def op_bytes(self) -> int:  # ACM
        return int(self.classes.groups.group_bytes.sum())

    @property
    def op_ms(self) -> float:
        return float(self.classes.groups.group_ms.sum())

    @property
    def max_discard_bytes(self) -> int:
        """The most c can discard: every free op group recomputed."""
        c = self.classes
        return self.y_bytes + (int(c.class_bytes @ c.multiplicity) if len(c.members) else 0)

    @property
    def y_bytes(self) -> int:
        """Discarded bytes when checkpointed and every free group saved."""
        c = self.classes
        return self.act_saved_bytes - (self.op_bytes - c.always_recomputed_bytes)


@dataclass
class Frontiers:
    """Every candidate's useful frontier points as (discard, recompute) arrays: what the list searches read.

    Point j of candidate i discards ``d[i][j]`` bytes for ``rc[i][j]`` ms and
    is point ``point[i][j]`` of the module's :class:`Frontier`. Candidates
    whose whole frontier is too long to list (a module spanning a whole
    model) have no points here (``giants``); per budget
    :func:`planner.solve.giants.for_budget` lists the part a plan can use into
    ``capped``.
    """

    d: list[np.ndarray]  # per candidate: discarded bytes of useful points, ascending (int64)
    rc: list[np.ndarray]  # recompute ms, ascending
    point: list[np.ndarray]  # index of each point in the module's Frontier
    starts: list[int]  # first candidate of each candidate's subtree
    hulls: list[tuple[np.ndarray, np.ndarray]]  # lower hull vertices per candidate (MiB, ms)
    fid: list[int] = field(default_factory=list)  # equal for candidates with the same frontier
    max_d: list[int] = field(default_factory=list)  # per candidate: its largest discard
    giants: dict[int, str] = field(default_factory=dict)
    capped: dict[int, Any] = field(default_factory=dict)  # candidate -> a Frontier-like of its capped points

    def with_points(self, d: list[np.ndarray], rc: list[np.ndarray], point: list[np.ndarray]) -> Frontiers:
        """The same candidates with other point lists (a subset of each)."""
        return Frontiers(d, rc, point, self.starts, self.hulls, self.fid, self.max_d, self.giants, self.capped)


@dataclass
class Problem:
    """A stats document prepared for planning; reused across budgets."""

    stats: Stats
    model: MemoryModel
    candidates: list[Candidate]
    node_key: np.ndarray  # per module (pre-order): candidates finishing before it
    chains: list[list[int]]  # candidate index chains that may hold at most one checkpoint
    unit: float  # bytes per MILP memory unit: a power of two near the peak, so values are O(1)
    _frontier_cache: dict[tuple, Frontier | None] = field(default_factory=dict)
    _frontier_of: dict[str, Frontier | None] = field(default_factory=dict)  # fqn -> frontier: no ops_key hashed
    _key_cache: dict[str, tuple] = field(default_factory=dict)  # fqn -> ops_key
    _classes: dict[tuple, GroupClasses] = field(default_factory=dict)  # ops_key -> the candidates' op classes
    _hull_cache: dict[tuple, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    _derived: dict[str, Any] = field(default_factory=dict)

    def frontier(self, fqn: str) -> Frontier | None:
        """The module's frontier, or None when it is too long to list (then planned from capped parts, or by the MILP)."""
        if fqn in self._frontier_of:  # an ops_key is a tuple per op: hashing it again per call cost more than the rest
            return self._frontier_of[fqn]
        m = self.stats.module(fqn)
        key = self._key_cache.get(fqn)
        if key is None:
            key = self._key_cache[fqn] = ops_key(m)
        if key not in self._frontier_cache:
            try:
                self._frontier_cache[key] = module_frontier(m.recompute_ops, m.force_store_random,
                                                            max_points=FRONTIER_LIMIT, max_items=FRONTIER_ITEMS,
                                                            groups=self.op_groups_of(key))
            except FrontierTooLarge:
                self._frontier_cache[key] = None
        return self._frontier_of.setdefault(fqn, self._frontier_cache[key])

    def op_groups_of(self, key: tuple) -> OpGroups | None:
        """The op groups of the candidates with this ops_key (settled), if any has it."""
        classes = self._classes.get(key)
        return None if classes is None else classes.groups

    def hull(self, cand: Candidate) -> tuple[tuple[float, float], ...]:
        """Facets (slope, intercept) of ``cand``'s frontier hull in MILP units (cached per op list).

        Every op decision lies on or above this hull, so the facets are valid
        cuts; they give the LP relaxation the exact multiple-choice bound.
        """
        key = (cand.ops_key, cand.act_saved_bytes, cand.overhead_ms, cand.calls)
        if key not in self._hull_cache:
            f = self.frontier(cand.fqn)
            facets: tuple[tuple[float, float], ...] = ()
            if f is not None and len(f) >= 2:
                d = (cand.act_saved_bytes - f.saved_bytes) / self.unit
                hx, hy, slopes = lower_hull(d, cand.cost(f.recompute_ms))
                facets = tuple((float(k), float(y - k * x)) for k, x, y in zip(slopes, hx[:-1], hy[:-1]))
            self._hull_cache[key] = facets
        return self._hull_cache[key]

    def derived(self, name: str, build: Callable[[Problem], Any]) -> Any:
        """Budget-independent data derived from this problem: built once by ``build(self)``, shared by a sweep."""
        if name not in self._derived:
            self._derived[name] = build(self)
        return self._derived[name]

    def has_derived(self, name: str) -> bool:
        """Whether :meth:`derived` has built ``name`` already."""
        return name in self._derived

    def repeat_counts(self) -> dict[int, np.ndarray]:
        """Candidate index -> per moment, how many of its calls after the first discard then (candidates called
        more than once whose stats describe every call; the key covers the first call)."""
        return self.derived("repeats", lambda p: {i: p.model.repeats[c.fqn] for i, c in enumerate(p.candidates)
                                                  if c.fqn in p.model.repeats})

    def held_counts(self) -> dict[int, np.ndarray]:
        """Candidate index -> per moment, how many of its calls are in their own backward then (each holding its
        inputs: ``held_input_bytes``), for the candidates that hold any."""
        def build(p: Problem) -> dict[int, np.ndarray]:
            model, out = p.model, {}
            backward = np.array([ph == "backward" for ph in model.phases], dtype=bool)
            for i, c in enumerate(p.candidates):
                if model.held_bytes.get(c.fqn):
                    first = backward & (model.keys <= c.post_pos) & (model.keys >= model.first_pos[c.fqn])
                    out[i] = first + model.repeats_held.get(c.fqn, 0)
            return out
        return self.derived("held", build)

    def checkpointed_extra_bytes(self) -> dict[int, np.ndarray]:
        """Candidate index -> per moment, what checkpointing it adds to the backward: the inputs its calls hold
        (``held_counts``) and, where its recompute runs, what the recompute holds beyond the backward's memory
        (the engines' figure: ``MemoryModel.engine_transient``)."""
        def build(p: Problem) -> dict[int, np.ndarray]:
            held, out = p.held_counts(), {}
            for i, c in enumerate(p.candidates):
                extra = p.model.transient_bytes(c.fqn, None)
                if i in held:
                    extra = extra + held[i] * p.model.held_bytes[c.fqn]
                if extra.any():
                    out[i] = extra
            return out
        return self.derived("extra", build)

    def frontiers(self) -> Frontiers:
        """Every candidate's frontier points (built once)."""
        return self.derived("frontiers", _build_frontiers)

    def subtree_starts(self) -> list[int]:
        """For each candidate (post-order index), the first candidate index of its subtree."""
        idx = {c.fqn: i for i, c in enumerate(self.candidates)}
        start = list(range(len(self.candidates)))
        for i, c in enumerate(self.candidates):
            p = self.stats.module(c.fqn).parent
            while p is not None:
                if p in idx:
                    start[idx[p]] = min(start[idx[p]], start[i])
                p = self.stats.module(p).parent
        return start


def prepare(
    stats: Stats,
    *,
    world_size: int = 1,
    ac_units: Sequence[str] | None = None,
    fsdp_units: Sequence[str] | None = None,
    first_step_only: bool = False,
    reserve_bytes: float = 0.0,
) -> Problem:
    """Build everything that does not depend on the budget.

    Without ``fsdp_units``, stats collected sharded give theirs (``metadata.sharding.units``).
    """
    if fsdp_units is None and stats.metadata.sharding is not None:
        fsdp_units = stats.metadata.sharding.units
    model = memory_model(stats, world_size=world_size, first_step_only=first_step_only, reserve_bytes=reserve_bytes)
    allowed = _allowed(stats, ac_units, fsdp_units)
    unit = float(2 ** max(0, math.floor(math.log2(max(float(model.base_bytes.max()), 1.0)))))
    last_post = len(stats.fw_post_order) - 1
    post = {f: k for k, f in enumerate(stats.fw_post_order)}
    cands: list[Candidate] = []
    class_cache: dict[tuple, GroupClasses] = {}
    first_of: dict[tuple, tuple[tuple, GroupClasses]] = {}  # ops_key -> (the first equal key, its op classes)
    # A module finishing last frees nothing before any module's peak.
    modules = [stats.module(f) for f in stats.fw_post_order if f in allowed and post[f] != last_post]
    shapes = Counter(_ops_shape(m) for m in modules)
    for m in modules:
        fqn = m.fqn
        # equal keys need equal shapes: a module alone in its shape (the model-spanning ones, thousands of ops)
        # gets a key no other can equal, without a tuple per op
        key = ops_key(m) if shapes[_ops_shape(m)] > 1 else (_ALONE, fqn)
        if (entry := first_of.get(key)) is None:  # equal keys become one object: later work tells them by id
            entry = first_of[key] = (key, group_classes(op_groups(m.recompute_ops, m.force_store_random)))
            class_cache[key] = entry[1]
        key, classes = entry
        cand = Candidate(fqn, post[fqn], discardable_bytes(m), classes, key, m.checkpoint_overhead_ms or 0.0, m.calls)
        if cand.max_discard_bytes > 0:
            cands.append(cand)
    cand_post = np.array([c.post_pos for c in cands], dtype=np.int64)
    node_key = np.searchsorted(cand_post, model.keys, side="left")
    return Problem(stats, model, cands, node_key, _chains(stats, [c.fqn for c in cands]), unit,
                   _key_cache={c.fqn: c.ops_key for c in cands}, _classes=class_cache)


def ops_key(m: ModuleStats) -> tuple:
    """Modules with equal op lists (repeated layers) share derived work."""
    ops = m.ops or ()
    # priced as plans are: modules that recompute alike share work
    return (m.force_store_random, tuple(map(_OP_FIELDS, ops)), tuple(m.recompute_runtimes_ms))


_ALONE = "a module alone in its ops' shape"


def _ops_shape(m: ModuleStats) -> tuple[bool, int]:
    return m.force_store_random, len(m.ops or ())


_OP_FIELDS = attrgetter("name", "output_bytes", "view_like", "random", "inplace_parent", "must_save")


def key_needs(prob: Problem, budget_bytes: float) -> np.ndarray:
    """Per key (candidates finished), the largest need over modules at that key; -inf if none."""
    out = np.full(len(prob.candidates) + 1, -np.inf)
    np.maximum.at(out, prob.node_key, prob.model.base_bytes - budget_bytes)
    return out


def held_needs(prob: Problem, budget_bytes: float) -> dict[int, float]:
    """Candidate i -> what the discards finished before its subtree must reach when i is checkpointed: the
    largest need over the moments of its own backward, where it holds its inputs (``held_input_bytes``).

    There no discard of i's subtree is credited (i's recompute has brought them back, and nothing inside a
    checkpointed module is checkpointed), so one threshold on the running sum at the subtree's start covers them.
    """
    return {i: peak - budget_bytes for i, peak in prob.derived("held_peaks", _held_peaks).items()}


def _held_peaks(prob: Problem) -> dict[int, float]:
    """Candidate i -> the most memory where its checkpointing adds some (-inf: nowhere): ``held_needs`` + budget."""
    model, out = prob.model, {}
    for i, extra in prob.checkpointed_extra_bytes().items():
        at = extra > 0
        out[i] = float(np.max(model.base_bytes[at] + extra[at])) if at.any() else -np.inf
    return out


def need_rows(keys: np.ndarray, values: np.ndarray) -> list[tuple[int, float]]:
    """Per key the largest value, keeping only keys whose value beats every smaller key's."""
    best: dict[int, float] = {}
    for k, v in zip(keys.tolist(), values.tolist()):
        best[k] = max(best.get(k, -np.inf), v)
    out, running = [], -np.inf
    for k in sorted(best):
        if best[k] > running:
            out.append((k, best[k]))
            running = best[k]
    return out


def _allowed(stats: Stats, ac_units: Sequence[str] | None, fsdp_units: Sequence[str] | None) -> set[str]:
    """The modules a plan may checkpoint; ValueError naming a unit the stats cannot use."""
    names = set(stats.fw_pre_order)
    for field_name, units in (("ac_units", ac_units), ("fsdp_units", fsdp_units)):
        for k, f in enumerate(units or ()):
            if f not in names:
                raise ValueError(f"{field_name}[{k}] {f!r} is not a module of the stats")
    checkpointable = {m.fqn for m in stats.modules if not m.is_leaf and m.ops}
    if ac_units is not None:
        for k, f in enumerate(ac_units):
            m = stats.module(f)
            if m.parent is None:
                raise ValueError(f"ac_units[{k}] {f!r} is the root module: it finishes last and frees nothing "
                                 f"before any peak, so it is never checkpointed")
            if m.is_leaf:
                raise ValueError(f"ac_units[{k}] {f!r} is a leaf module; leaf modules are never checkpointed")
            if not m.ops:
                raise ValueError(f"ac_units[{k}] {f!r} has no op stats, so it cannot be checkpointed")
        checkpointable &= set(ac_units)
    # A checkpointed module may not contain an FSDP unit (the unit itself may be checkpointed).
    for unit in fsdp_units or ():
        checkpointable = {f for f in checkpointable if not unit.startswith(f + ".")}
    return checkpointable


def _chains(stats: Stats, cand_fqns: list[str]) -> list[list[int]]:
    """For each deepest candidate, the candidates on its path to the root (if more than one)."""
    idx = {f: i for i, f in enumerate(cand_fqns)}
    has_cand_descendant = set()
    chain_of: dict[str, list[int]] = {}
    for f in cand_fqns:
        chain, p = [idx[f]], stats.module(f).parent
        while p is not None:
            if p in idx:
                chain.append(idx[p])
                has_cand_descendant.add(p)
            p = stats.module(p).parent
        chain_of[f] = chain
    return [c for f, c in chain_of.items() if f not in has_cand_descendant and len(c) > 1]


def _build_frontiers(prob: Problem) -> Frontiers:
    out = Frontiers([], [], [], prob.subtree_starts(), [])
    memo: dict[tuple, tuple] = {}
    fids: dict[tuple, int] = {}
    numbers: dict[tuple, int] = {}  # ops_key -> a number for it: a key of hundreds of ops is hashed once per object
    number_of: dict[int, int] = {}  # id(ops_key) -> its number (every candidate holds its key: ids stay unique)
    for i, cand in enumerate(prob.candidates):
        if (number := number_of.get(id(cand.ops_key))) is None:
            number = number_of[id(cand.ops_key)] = numbers.setdefault(cand.ops_key, len(numbers))
        key = (number, cand.act_saved_bytes, cand.overhead_ms, cand.calls)
        if key not in memo:
            memo[key] = _points(prob, cand)
        out.fid.append(fids.setdefault(key, len(fids)))
        d, rc, point, hull, max_d, giant = memo[key]
        for lst, v in zip((out.d, out.rc, out.point, out.hulls, out.max_d), (d, rc, point, hull, max_d)):
            lst.append(v)
        if giant:
            out.giants[i] = cand.fqn
    return out


def _points(prob: Problem, cand: Candidate) -> tuple:
    """(d, rc, point, hull, max discard, is a giant) of one candidate."""
    f = prob.frontier(cand.fqn)
    if f is None:  # too long to list: points per budget (planner.solve.giants), the hull from the knapsack's greedy
        m = prob.stats.module(cand.fqn)
        hd, hrc = frontier_hull(m.recompute_ops, m.force_store_random, act_saved_bytes=cand.act_saved_bytes,
                                groups=cand.classes.groups)
        none = np.zeros(0, np.int64)
        hull = hull_vertices(hd, cand.cost(hrc))
        return none, np.zeros(0), none, hull, int(hd[-1]) if len(hd) else 0, True
    d = cand.act_saved_bytes - f.saved_bytes[::-1]
    keep = d > 0  # a point that frees nothing is never part of a plan
    d, rc = d[keep].astype(np.int64), cand.cost(f.recompute_ms[::-1][keep])
    return d, rc, np.arange(len(f))[::-1][keep], hull_vertices(d, rc), int(d[-1]) if len(d) else 0, False

"""Offloading's model: the windows, the host link, which op groups may go to host memory, and what it costs.

A checkpointed module's free op group is saved, recomputed or *offloaded*:
saved, but its output is copied to host memory in the forward and fetched
back before the backward needs it. The forward post-order is cut into
windows, one per block of the model's widest module list (a decoder's
``layers``): window j ends when the forward of its ``end_module`` ends
(modules before the first block join window 0; the last window holds the
rest and ends with the root). The protocol apply follows:

* forward: an offloaded output is copied to host right after its op; at the
  end of window j+1's forward the device copies of window j are dropped;
* backward: when window j+1's backward starts, window j's outputs are fetched
  back; they then live until their last use, like kept ones.

So window j's offloaded bytes are off the device exactly at the moments
whose key is at least ``B_{j+1}`` (the post-order position of window j+1's
end module, plus one), in the forward and the backward alike: the same key
rule as a discard, one window later (:meth:`OffloadWindows.credits`). The
last window's offloads would never be credited: it has none. Each window's
copies hide behind the next window's compute; what they outlast is stall,
``max(0, O_j / d2h - F_{j+1}) + max(0, O_j / h2d - G_{j+1})``
(:meth:`OffloadWindows.stall_ms`; F, G: the next window's forward and
backward compute, without recompute, which makes the stall an upper bound).
A plan minimises recompute + stall.

A module called more than once (``calls`` > 1, with the stats' per-call counts) offloads *per call* instead:
each call copies the same ops' outputs to host memory when its forward ends and drops the device copies then
(after waiting for the copies), and fetches them back when its own recomputation takes them. So a call's
offloaded bytes are off the device exactly where that call's discard is in effect (the first call by key, the
later ones by ``repeats``): they count as more of the module's discard (``OffloadPlan.credits``: fqn ->
bytes). The host holds ``calls`` x the bytes; the copies hide behind nothing (stall = both copies of every
call, an upper bound). The op a chained call hands on (``chained_calls``) is never offloaded: the next call
holds it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from planner.ops.groups import SAVE
from planner.ops.knapsack import GroupClasses
from planner.solve.problem import Problem
from planner.stats.format import Stats
from planner.stats.metadata import MIN_HOST_LINK_GBPS

__all__ = ["GBPS_BYTES_PER_MS", "HostLinkFigures", "OffloadOptions", "OffloadPlan", "OffloadSetup", "OffloadWindows",
           "check_offloads", "decisions", "host_link", "offload_options", "offload_plan", "offload_setup", "offload_windows",
           "per_call_options"]

GBPS_BYTES_PER_MS = 1e6  # 1 GB/s = 1e9 bytes/s = 1e6 bytes/ms


@dataclass(frozen=True)
class HostLinkFigures:
    """The host link a plan assumes, GB/s per direction, and where the figures came from."""

    d2h_gbps: float
    h2d_gbps: float
    source: str  # "host_link_gbps option", or the stats' source

    @property
    def d2h_bytes_per_ms(self) -> float:
        return self.d2h_gbps * GBPS_BYTES_PER_MS

    @property
    def h2d_bytes_per_ms(self) -> float:
        return self.h2d_gbps * GBPS_BYTES_PER_MS


def host_link(stats: Stats, host_link_gbps: float | None) -> HostLinkFigures:
    """The link figures for offloading: the option's (both directions) over the stats' own; ValueError without
    either, or for stats offloading's model does not cover (a pipeline stage's, or without a timeline)."""
    meta = stats.metadata
    if meta.pipeline is not None:
        raise ValueError("offload 'on' is not supported for a pipeline stage's stats (metadata.pipeline): the "
                         "schedule interleaves micro-batches, which breaks the offload windows")
    if not stats.timeline:
        raise ValueError("offload 'on' needs stats with a timeline (sacplan collect writes one): offloading's windows "
                         "follow the step's own moments")
    if host_link_gbps is not None:
        if not math.isfinite(host_link_gbps) or host_link_gbps < MIN_HOST_LINK_GBPS:
            raise ValueError(f"host_link_gbps must be a positive number of GB/s (at least {MIN_HOST_LINK_GBPS:g}), "
                             f"got {host_link_gbps!r}")
        return HostLinkFigures(float(host_link_gbps), float(host_link_gbps), "host_link_gbps option")
    if meta.host_link_gbps is None:
        raise ValueError(f"host_link_gbps is needed with offload 'on': the stats carry no host link figure (target "
                         f"{meta.target_device or meta.device or 'not stated'})")
    link = meta.host_link_gbps
    return HostLinkFigures(float(link.d2h), float(link.h2d), link.source)


@dataclass(frozen=True)
class OffloadWindows:
    """The windows of one problem with one host link; window j's arrays at index j, in forward order."""

    end_modules: tuple[str, ...]  # the module whose forward ends each window ('' for the root: the last window)
    end_pos: np.ndarray  # its fw_post_order position (the root's for the last window)
    credit_key: np.ndarray  # B_{j+1}: window j's offloads are off the device at keys >= this (-1: never, the last)
    forward_ms: np.ndarray  # each window's own forward compute (the blocks' fw_ms; the rest for the first and last)
    backward_ms: np.ndarray  # the same for the backward (bw_ms), without recompute
    candidate_window: np.ndarray  # per candidate of the problem: its window
    link: HostLinkFigures

    def __len__(self) -> int:
        return len(self.end_modules)

    def hidden_ms(self, j: int) -> tuple[float, float]:
        """(forward, backward) compute window j's copies overlap: window j+1's (0, 0 for the last window)."""
        if j + 1 >= len(self):
            return 0.0, 0.0
        return float(self.forward_ms[j + 1]), float(self.backward_ms[j + 1])

    def copy_ms(self, offloaded_bytes: float) -> tuple[float, float]:
        """(to host, back to the device) ms of ``offloaded_bytes`` on the link."""
        return offloaded_bytes / self.link.d2h_bytes_per_ms, offloaded_bytes / self.link.h2d_bytes_per_ms

    def stall_ms(self, j: int, offloaded_bytes: float) -> float:
        """What window j's copies of ``offloaded_bytes`` add to the step: what they outlast the next window's
        forward (to host) and backward (back) compute by."""
        if offloaded_bytes <= 0:
            return 0.0
        d2h, h2d = self.copy_ms(offloaded_bytes)
        fw, bw = self.hidden_ms(j)
        return max(0.0, d2h - fw) + max(0.0, h2d - bw)

    def credits(self, window_bytes: Sequence[float] | np.ndarray) -> dict[int, float]:
        """The memory model's offload credits (``MemoryModel.profile_bytes(offloaded=)``) of per-window bytes:
        credit key -> bytes. ValueError for bytes in the last window, which nothing credits."""
        out: dict[int, float] = {}
        for j, nbytes in enumerate(window_bytes):
            if not nbytes:
                continue
            if self.credit_key[j] < 0:
                raise ValueError(f"window {j} is the last window: nothing it offloads leaves the device")
            out[int(self.credit_key[j])] = out.get(int(self.credit_key[j]), 0.0) + float(nbytes)
        return out


def offload_windows(prob: Problem, link: HostLinkFigures) -> OffloadWindows:
    """The windows of ``prob``: one per child of the module with the most children that are, or hold,
    candidates (a decoder's layer list: every child, whether it holds a candidate or not), plus the last window
    (the rest, ending with the root)."""
    stats = prob.stats
    post = prob.model.post_pos
    root = stats.fw_pre_order[0]
    blocks = _blocks(stats, {c.fqn for c in prob.candidates})
    end_modules = (*blocks, "")
    end_pos = np.array([post[b] for b in blocks] + [post[root]], dtype=np.int64)
    credit = np.full(len(end_pos), -1, dtype=np.int64)
    credit[:-1] = end_pos[1:] + 1
    fw = np.zeros(len(end_pos))
    bw = np.zeros(len(end_pos))
    for j, b in enumerate(blocks):
        fw[j], bw[j] = stats.module(b).fw_ms, stats.module(b).bw_ms
    if blocks:  # the modules before the first block join window 0; the rest of the root's compute is the last's
        before = _outermost(stats, [f for f in stats.fw_post_order[:post[blocks[0]]]
                                    if post[f] < prob.model.first_pos.get(blocks[0], post[blocks[0]])])
        fw[0] += sum(stats.module(f).fw_ms for f in before)
        bw[0] += sum(stats.module(f).bw_ms for f in before)
    r = stats.module(root)
    fw[-1] = max(0.0, r.fw_ms - float(fw[:-1].sum()))
    bw[-1] = max(0.0, r.bw_ms - float(bw[:-1].sum()))
    cand_post = np.array([c.post_pos for c in prob.candidates], dtype=np.int64)
    window = np.searchsorted(end_pos, cand_post, side="left")
    return OffloadWindows(end_modules, end_pos, credit, fw, bw, window, link)


def _blocks(stats: Stats, candidates: set[str]) -> list[str]:
    """The children (in forward post-order) of the module with the most children that are or hold candidates:
    all of them, candidates or not (each one's forward is compute the previous window's copies hide behind)."""
    holding: set[str] = set()
    for f in candidates:  # every ancestor of a candidate holds one
        p: str | None = f
        while p is not None and p not in holding:
            holding.add(p)
            p = stats.module(p).parent
    holders: dict[str, int] = {}
    children: dict[str, list[str]] = {}
    for f in stats.fw_post_order:
        parent = stats.module(f).parent
        if parent is not None:
            children.setdefault(parent, []).append(f)
            holders[parent] = holders.get(parent, 0) + (f in holding)
    best = max(stats.fw_pre_order, key=lambda f: holders.get(f, 0))  # the widest; the first of equals, pre-order
    return children.get(best, []) if holders.get(best, 0) else []


def _outermost(stats: Stats, fqns: list[str]) -> list[str]:
    """Those of ``fqns`` whose parent is not among them."""
    inside = set(fqns)
    return [f for f in fqns if stats.module(f).parent not in inside]


@dataclass(frozen=True)
class OffloadOptions:
    """Which free op groups of one candidate may be offloaded, per class of its op classes."""

    groups: tuple[tuple[int, ...], ...]  # per class: its offloadable groups, in the class's member order

    @property
    def counts(self) -> np.ndarray:
        """Per class, how many of its groups may be offloaded."""
        return np.array([len(g) for g in self.groups], dtype=np.int64)


def offload_options(prob: Problem, windows: OffloadWindows) -> dict[int, OffloadOptions]:
    """Candidate index -> its offloadable op groups, for the candidates that have any (window protocol).

    A candidate may offload when it is called once (no repeats, no chained calls) and is not in the last
    window (one called more than once: :func:`per_call_options`); a free op group may be offloaded when it has
    bytes and none of its ops is a view or makes a
    tensor another module holds (``held_tensors``: the holder keeps the device copy alive).
    """
    out: dict[int, OffloadOptions] = {}
    last = len(windows) - 1
    for i, cand in enumerate(prob.candidates):
        m = prob.stats.module(cand.fqn)
        if windows.candidate_window[i] >= last or cand.calls > 1 or cand.fqn in prob.model.repeats \
                or m.chained_calls is not None or not m.ops:
            continue
        classes = cand.classes
        groups = tuple(tuple(gi for gi in members if _offloadable(classes, gi, m.ops)) for members in classes.members)
        if any(groups):
            out[i] = OffloadOptions(groups)
    return out


def per_call_options(prob: Problem) -> dict[int, OffloadOptions]:
    """Candidate index -> its offloadable op groups, for the candidates called more than once with per-call
    counts in the stats (``Problem.model.repeats``): each call offloads them and drops them when it ends (the
    module doc). Groups as :func:`offload_options`, less the op a chained call hands on to the next call."""
    out: dict[int, OffloadOptions] = {}
    for i, cand in enumerate(prob.candidates):
        m = prob.stats.module(cand.fqn)
        if cand.calls <= 1 or cand.fqn not in prob.model.repeats or not m.ops:
            continue
        chained = m.chained_calls[0] if m.chained_calls is not None else None
        classes = cand.classes
        members = classes.groups.members
        groups = tuple(tuple(gi for gi in mem if _offloadable(classes, gi, m.ops) and chained not in members[gi])
                       for mem in classes.members)
        if any(groups):
            out[i] = OffloadOptions(groups)
    return out


def _offloadable(classes: GroupClasses, gi: int, ops) -> bool:
    g = classes.groups
    return int(g.group_bytes[gi]) > 0 and not any(ops[k].view_like or ops[k].held_tensors for k in g.members[gi])


def decisions(classes: GroupClasses, options: OffloadOptions | None, recomputed: np.ndarray,
              offloaded: np.ndarray) -> tuple[list[int], list[int]]:
    """Per-op (save, offload) lists recomputing ``recomputed[q]`` and offloading ``offloaded[q]`` free groups of
    each class q: the offloaded ones among the offloadable groups, the recomputed ones among the others first.

    ValueError when the counts do not fit the class (``recomputed + offloaded`` over its groups, or more
    offloaded than it has offloadable groups).
    """
    g = classes.groups
    group_save = (g.fixed == SAVE).astype(np.int8)
    group_off = np.zeros(len(g.members), dtype=np.int8)
    for q, members in enumerate(classes.members):
        k, f = int(recomputed[q]), int(offloaded[q])
        able = options.groups[q] if options is not None else ()
        if k < 0 or f < 0 or k + f > len(members) or f > len(able):
            raise ValueError(f"class {q}: {k} recomputed and {f} offloaded groups do not fit its {len(members)} "
                             f"groups ({len(able)} offloadable)")
        off = set(able[:f])
        rest = [gi for gi in members if gi not in off]
        rest.sort(key=lambda gi: gi in able)  # recompute the groups that cannot be offloaded first (stable)
        recompute = set(rest[:k])
        for gi in members:
            group_save[gi] = gi not in recompute
            group_off[gi] = gi in off
    return g.op_decisions(group_save), g.op_decisions(group_off)


@dataclass(frozen=True)
class OffloadSetup:
    """What every engine needs to plan with offload, for one problem and one link: built once per request."""

    windows: OffloadWindows
    options: dict[int, OffloadOptions]  # candidate index -> its offloadable groups (candidates with any)
    per_call: dict[int, OffloadOptions] = field(default_factory=dict)  # the same, modules called more than once

    def able(self, i: int) -> OffloadOptions | None:
        """Candidate ``i``'s offloadable groups, either protocol (None: none)."""
        return self.options.get(i, self.per_call.get(i))


def offload_setup(prob: Problem, link: HostLinkFigures) -> OffloadSetup:
    """The windows and every candidate's offloadable groups of ``prob`` with ``link`` (shared by a sweep)."""
    def build(p: Problem) -> OffloadSetup:
        windows = offload_windows(p, link)
        return OffloadSetup(windows, offload_options(p, windows), per_call_options(p))
    return prob.derived(f"offload {link.d2h_gbps!r} {link.h2d_gbps!r}", build)


@dataclass(frozen=True)
class OffloadPlan:
    """A plan's offloads: per module its offload list, per window its bytes and stall."""

    windows: OffloadWindows
    modules: dict[str, list[int]]  # fqn -> 1 per op offloaded (saved, and copied to host memory)
    module_bytes: dict[str, int]  # fqn -> bytes it offloads
    window_bytes: np.ndarray  # per window
    window_stall_ms: np.ndarray  # per window
    calls: dict[str, int] = field(default_factory=dict)  # fqn -> calls, for modules offloading per call
    call_stall_ms: float = 0.0  # their copies' time: every call's, hidden behind nothing

    @property
    def stall_ms(self) -> float:
        return math.fsum(self.window_stall_ms.tolist()) + self.call_stall_ms

    @property
    def host_bytes(self) -> int:
        """Host memory the offloads take (per micro-batch): all of them are there at the forward's end, each
        call's of a module offloading per call."""
        return int(sum(b * self.calls.get(f, 1) for f, b in self.module_bytes.items()))

    @property
    def credits(self) -> dict[int | str, float]:
        """The memory model's credits (``MemoryModel.profile_bytes(offloaded=)``): credit key -> bytes of the
        windows, and fqn -> bytes per call of the modules offloading per call (off wherever their discard is)."""
        out: dict[int | str, float] = dict(self.windows.credits(self.window_bytes))
        for fqn in self.calls:
            if self.module_bytes.get(fqn):
                out[fqn] = float(self.module_bytes[fqn])
        return out


def offload_plan(prob: Problem, windows: OffloadWindows, offloads: Mapping[str, Sequence[int]]) -> OffloadPlan:
    """The :class:`OffloadPlan` of per-module offload lists (fqn -> 1 per op offloaded); ValueError for a list
    of the wrong length or a module in the last window. A module called more than once offloads per call."""
    post = prob.model.post_pos
    lists, nbytes = {}, {}
    calls: dict[str, int] = {}
    call_stall = 0.0
    per_window = np.zeros(len(windows))
    for fqn, offload in offloads.items():
        ops = prob.stats.module(fqn).ops or []
        if len(offload) != len(ops):
            raise ValueError(f"offload list of {fqn!r} has {len(offload)} entries for its {len(ops)} ops")
        lists[fqn] = [int(v) for v in offload]
        nbytes[fqn] = sum(op.output_bytes for op, v in zip(ops, offload) if v)
        n_calls = prob.stats.module(fqn).calls
        if n_calls > 1:  # per call: dropped at the call's end, fetched in its backward, nothing hides the copies
            calls[fqn] = n_calls
            call_stall += n_calls * sum(windows.copy_ms(nbytes[fqn]))
            continue
        j = int(np.searchsorted(windows.end_pos, post[fqn], side="left"))
        if j >= len(windows) - 1 and nbytes[fqn]:
            raise ValueError(f"{fqn!r} is in the last offload window: nothing it offloads leaves the device")
        per_window[j] += nbytes[fqn]
    stall = np.array([windows.stall_ms(j, b) for j, b in enumerate(per_window.tolist())])
    return OffloadPlan(windows, lists, nbytes, per_window, stall, calls, call_stall)


def check_offloads(prob: Problem, setup: OffloadSetup, saves: Mapping[str, Sequence[int]],
                   offloads: Mapping[str, Sequence[int]]) -> None:
    """ValueError naming the first offload the model does not allow: of a module not checkpointed (no save list)
    or without offloadable groups, of an op not saved, or of a group not offloadable or offloaded in part.
    An engine's plan passes this before :func:`offload_plan` prices it."""
    index = {c.fqn: i for i, c in enumerate(prob.candidates)}
    for fqn, offload in offloads.items():
        if not any(offload):
            continue
        i = index.get(fqn)
        if fqn not in saves or i is None or setup.able(i) is None:
            raise ValueError(f"{fqn!r} offloads, but it is not a checkpointed module that may offload")
        save, opts = saves[fqn], setup.able(i)
        for k, (o, s) in enumerate(zip(offload, save)):
            if o and not s:
                raise ValueError(f"{fqn!r} offloads op {k}, which it does not save")
        groups = prob.candidates[i].classes.groups.members
        allowed = {g for able in opts.groups for g in able}
        for g, members in enumerate(groups):
            flags = {int(offload[k]) for k in members}
            if flags == {1} and g not in allowed:
                raise ValueError(f"{fqn!r} offloads op group {g} (ops {list(members)}), which may not be offloaded")
            if len(flags) > 1:
                raise ValueError(f"{fqn!r} offloads part of op group {g} (ops {list(members)}): one decision")

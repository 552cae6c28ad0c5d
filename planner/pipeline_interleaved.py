"""Interleaved 1F1B: one rank's model chunks along its schedule, the collected microbatch's moments laid out per
chunk and microbatch.

A rank holds V model chunks (stage ``rank + stages x v`` of the whole pipeline
for its local chunk v). Its stats describe two microbatches, each running the
rank's chunks as one microbatch passes them: every chunk's forward in local
order, then every chunk's backward in reverse order, so that while chunk v runs,
the same microbatch's earlier chunks hold their activations, as in the schedule
(a microbatch's forward on chunk v comes after its forward on chunk v - 1, and
its backward on chunk v before its backward on chunk v - 1). Each event of the
schedule (:func:`interleaved_order`) takes the moments of its chunk and phase of
the collected microbatch (the first while the rank has run no backward, else the
second, which holds gradients) and adds, per chunk u, the other microbatches that
chunk holds (``held_bytes`` each, and one more discarding call of each of the
chunk's checkpointed modules), the outputs and input gradients the runtime's
sends keep (``ScheduleInterleaved1F1B`` waits for its sends only when the step
ends), and every other microbatch's P2P buffers. See docs/pipeline.md.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np

__all__ = ["ChunkEvent", "interleaved_order", "interleaved_events", "interleaved_in_flight",
           "interleaved_stage_model"]


def interleaved_order(rank: int, stages: int, virtual: int, microbatches: int) -> list[tuple[int, str, int]]:
    """Rank ``rank``'s (local chunk, phase, microbatch from 1) in the order ``ScheduleInterleaved1F1B`` runs them.

    Microbatches go in rounds of R = M / max(1, M // S): the forwards take R microbatches on chunk 0, the next R
    on chunk 1, and so on round after round; the backwards the same from the last chunk down. A warm-up of
    (V - 1) x R + 2 x (S - 1 - rank) forwards (at most M x V), then a forward and a backward in turn, then the
    remaining backwards (Narayanan et al. 2021, section 2.2.2; derived in docs/pipeline.md).
    """
    rounds = max(1, microbatches // stages)
    per_round = microbatches // rounds
    total = virtual * microbatches
    warmup = min((virtual - 1) * per_round + 2 * (stages - 1 - rank), total)
    fwd_next, bwd_next = [1] * virtual, [1] * virtual

    def forward(k: int) -> tuple[int, str, int]:
        v = (k // per_round) % virtual
        fwd_next[v] += 1
        return v, "forward", fwd_next[v] - 1

    def backward(k: int) -> tuple[int, str, int]:
        v = virtual - 1 - (k // per_round) % virtual
        bwd_next[v] += 1
        return v, "backward", bwd_next[v] - 1

    order = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        order.append(forward(warmup + k))
        order.append(backward(k))
    order += [backward(k) for k in range(total - warmup, total)]
    return order


class ChunkEvent(NamedTuple):
    """One forward or backward of one chunk of a rank, and what each chunk holds beside it."""

    chunk: int
    phase: str
    microbatch: int
    held: tuple[int, ...]  # per chunk: other microbatches between their forward and their backward there
    done: tuple[int, ...]  # per chunk: backwards finished before it


def interleaved_events(rank: int, stages: int, virtual: int, microbatches: int) -> list[ChunkEvent]:
    """:func:`interleaved_order` with each event's per-chunk counts (the event's own microbatch left out)."""
    open_: list[set[int]] = [set() for _ in range(virtual)]
    done = [0] * virtual
    events = []
    for v, phase, j in interleaved_order(rank, stages, virtual, microbatches):
        events.append(ChunkEvent(v, phase, j, tuple(len(o - {j}) for o in open_), tuple(done)))
        if phase == "forward":
            open_[v].add(j)
        else:
            open_[v].discard(j)
            done[v] += 1
    return events


def interleaved_in_flight(rank: int, stages: int, virtual: int, microbatches: int) -> int:
    """The most (chunk, microbatch) activations the rank holds at once, the running one included."""
    most = held = 0
    for _, phase, _ in interleaved_order(rank, stages, virtual, microbatches):
        if phase == "forward":
            held += 1
            most = max(most, held)
        else:
            held -= 1
    return most


def _owner(fqn: str | None, chunks: Any) -> int | None:
    if fqn is None:
        return None
    for u, c in enumerate(chunks):
        if any(fqn == p or fqn.startswith(p + ".") for p in c.modules):
            return u
    return None


def _chunk_of_moments(model: Any, chunks: Any) -> np.ndarray:
    """Per moment, the local chunk running it: an owned module's chunk, else the next owned moment's of the same
    phase and microbatch (a chunk's rotary embedding runs just before its layers), else the previous one's."""
    n = len(model.phases)
    owner = np.array([(-1 if (u := _owner(f, chunks)) is None else u) for f in model.modules])
    out = owner.copy()
    nxt = -1
    for t in range(n - 1, -1, -1):
        if t + 1 < n and (model.phases[t + 1], model.micro_batches[t + 1]) != (model.phases[t],
                                                                                 model.micro_batches[t]):
            nxt = -1
        if owner[t] >= 0:
            nxt = owner[t]
        elif nxt >= 0:
            out[t] = nxt
    prev = 0
    for t in range(n):
        if out[t] < 0:
            out[t] = prev
        prev = out[t]
    return out


def _second(e: ChunkEvent) -> bool:
    """Whether the event takes the second collected microbatch's moments (the one holding gradients): a backward
    once its chunk has run one, a forward once the rank has run any backward."""
    return e.done[e.chunk] > 0 if e.phase == "backward" else sum(e.done) > 0


def _event_bytes(e: ChunkEvent, info: Any, second: bool) -> float:
    """What the event adds to the collected moments of its chunk and phase (microbatch 2 if ``second``, else 1).

    Per chunk u: the other microbatches it holds; the outputs and input gradients its sends keep referenced
    (every backward done, until the step ends); its parameter gradients and input gradient where the collected
    microbatch has them and the schedule has not (or the other way round). In a collected backward of chunk v,
    the later chunks of the same microbatch have run their backward already, and their outputs are still kept
    by the collection (a send keeps them in the schedule, counted with the sends).
    """
    total_chunks = info.stages * info.virtual_stages
    backward = e.phase == "backward"
    extra = (info.microbatches - 1) * info.buffer_bytes
    for u, c in enumerate(info.chunks):
        extra += e.held[u] * c.held_bytes
        if c.stage_index < total_chunks - 1:
            extra += e.done[u] * c.output_bytes
        if backward and u > e.chunk:
            extra -= c.output_bytes
        own = backward and u == e.chunk
        collected_has = second if own else second or (backward and u > e.chunk)
        if not own:
            extra += (int(e.done[u] > 0) - int(collected_has)) * c.grad_bytes
        extra += (e.done[u] - int(collected_has)) * c.input_grad_bytes
    return float(extra)


def interleaved_stage_model(model: Any, info: Any) -> Any:
    """The memory model of a rank's whole interleaved step from the model of its two collected microbatches."""
    chunks = info.chunks
    phases = np.array(model.phases)
    micro = np.array([t or 0 for t in model.micro_batches])
    chunk_of = _chunk_of_moments(model, chunks)
    parts: list[tuple[np.ndarray, int, tuple[int, ...], float]] = []
    seen = set()
    for e in interleaved_events(info.stage, info.stages, info.virtual_stages, info.microbatches):
        second = _second(e)
        extra = _event_bytes(e, info, second)
        key = (e.chunk, e.phase, second, e.held, extra)
        if key in seen:
            continue
        seen.add(key)
        idx = np.flatnonzero((phases == e.phase) & (micro == 1 + int(second)) & (chunk_of == e.chunk))
        parts.append((idx, e.microbatch, e.held, extra))
    # the optimizer step: the schedule has returned (its sends waited for), every microbatch's buffers still there
    parts.append((np.flatnonzero(phases == "optimizer"), 0, (0,) * len(chunks),
                  (info.microbatches - 1) * info.buffer_bytes - sum(c.input_grad_bytes for c in chunks)))
    idx = np.concatenate([p[0] for p in parts])
    added = np.concatenate([np.full(len(p[0]), p[3], dtype=np.float64) for p in parts])
    held = np.array([p[2] for p in parts for _ in range(len(p[0]))], dtype=np.float64).reshape(len(idx), len(chunks))
    root = min(model.post_pos, key=lambda f: f.count("."))
    repeats = {}
    for f in model.post_pos:
        if f == root:
            continue
        u = _owner(f, chunks)
        extra_calls = held[:, u] if u is not None else held.sum(axis=1)  # a shared module runs in every chunk
        repeats[f] = np.asarray(model.repeats.get(f, np.zeros(len(phases))))[idx] + extra_calls
    kinds = {k: v[idx] for k, v in model.base_by_kind.items()}
    if "activations" in kinds:
        kinds["activations"] = kinds["activations"] + added
    micro_out = tuple(int(j) if j else None for p in parts for j in [p[1]] * len(p[0]))
    note = (f"{model.note}; pipeline rank {info.stage} of {info.stages}, interleaved-1f1b x {info.virtual_stages} "
            f"chunks, {info.microbatches} microbatches (up to "
            f"{interleaved_in_flight(info.stage, info.stages, info.virtual_stages, info.microbatches)} chunk-"
            f"microbatches in flight)")
    return replace(model, note=note, keys=model.keys[idx], base_bytes=model.base_bytes[idx] + added,
                   phases=tuple(phases[idx]), modules=tuple(model.modules[i] for i in idx),
                   repeats=repeats, repeats_held={f: np.asarray(v)[idx] for f, v in model.repeats_held.items()},
                   micro_batches=micro_out, grad_accumulation=info.microbatches, base_by_kind=kinds)

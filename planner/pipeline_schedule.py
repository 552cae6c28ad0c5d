"""A pipeline stage's memory along its schedule: the collected microbatch's moments, laid out per microbatch.

The stats of a stage (``metadata.pipeline``) describe two microbatches of it
run one after the other: the first with no gradients yet, the second holding
the first one's. Along the schedule the stage runs a forward or a backward of
one microbatch at a time while others wait between their forward and their
backward, each keeping ``held_bytes`` (its saved activations and its output),
less what every checkpointed module of it discards. So each event of the
schedule (:func:`stage_events`) takes the moments of the collected microbatch
of the same phase (the first before any backward has run, else the second) and
adds, per moment:

* ``held`` other microbatches: ``held * held_bytes``, and ``held`` more calls
  discarding for every module (the memory model's per-moment repeat counts, so
  a checkpointed module's discard counts once per microbatch held);
* the received activations' gradients of the backwards done before it, beyond
  the one the second microbatch holds already (``input_grad_bytes``);
* every other microbatch's P2P receive buffers (``buffer_bytes``), live all step.

See docs/pipeline.md for the schedules' counts and their sources.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np

__all__ = ["Event", "stage_events", "in_flight", "schedule_stage_model"]


class Event(NamedTuple):
    """One forward or backward of a stage's schedule, and what is live beside it."""

    phase: str  # forward or backward
    microbatch: int  # from 1
    held: int  # other microbatches between their forward and their backward
    done: int  # backwards finished before it
    input_grads: int  # received activations' gradients of earlier microbatches still referenced
    sent_outputs: int  # outputs of microbatches whose backward is done, still referenced by a send


def stage_events(schedule: str, stage: int, stages: int, microbatches: int) -> list[Event]:
    """Stage ``stage``'s forwards and backwards in the order ``torch.distributed.pipelining`` runs them.

    Beyond the schedule itself, what its code keeps referenced (torch 2.5 to 2.13): GPipe waits for every send
    at the end of its phase, so each finished microbatch's output (forward sends) and its input gradient
    (backward sends) stay until the step returns; 1F1B keeps the previous backward's send (one input gradient)
    and, past the warmup, the last send the warmup fired (microbatch ``warmup - 1``'s output) until its
    steady phase ends.
    """
    m = microbatches
    if schedule == "gpipe":
        order = [("forward", j) for j in range(1, m + 1)] + [("backward", j) for j in range(1, m + 1)]
        warmup = m
    elif schedule == "1f1b":  # stages - stage forwards, then one backward and one forward in turn, then the rest
        warmup = min(m, stages - stage)
        order = [("forward", j) for j in range(1, warmup + 1)]
        nxt = warmup + 1
        for j in range(1, m + 1):
            order.append(("backward", j))
            if nxt <= m:
                order.append(("forward", nxt))
                nxt += 1
    else:
        raise ValueError(f"pipeline.schedule {schedule!r}: only gpipe and 1f1b stages are laid out")
    last_stage = stage == stages - 1
    steady_end = m - warmup + 1  # 1F1B: the backward after which its steady phase ends
    events, open_, done = [], 0, 0
    for phase, j in order:
        if phase == "backward":
            open_ -= 1
        if schedule == "gpipe":
            grads, sent = done, 0 if last_stage else done
        else:
            grads = min(done, 1)
            kept = warmup - 1  # the warmup's last fired send (none with a warmup of one)
            sent = int(not last_stage and kept >= 1 and done >= kept and
                       (phase == "forward" and done <= steady_end or phase == "backward" and j <= steady_end))
        events.append(Event(phase, j, open_, done, grads, sent))
        if phase == "forward":
            open_ += 1
        else:
            done += 1
    return events


def in_flight(schedule: str, stage: int, stages: int, microbatches: int) -> int:
    """The most microbatches stage ``stage`` holds at once (forward done or running, backward not done)."""
    return max(e.held + 1 for e in stage_events(schedule, stage, stages, microbatches))


def schedule_stage_model(model: Any, info: Any, output_bytes: int) -> Any:
    """The memory model of a stage's whole step from the model of its two collected microbatches (see above);
    ``output_bytes``: the stage's output for one microbatch (what a send holds)."""
    m = info.microbatches
    micro = np.array([t or 0 for t in model.micro_batches])
    phases = np.array(model.phases)
    source = {(p, k): np.flatnonzero((phases == p) & (micro == k)) for p in ("forward", "backward") for k in (1, 2)}
    parts: list[tuple[np.ndarray, int, int, float]] = []  # (moment indices, microbatch, held, bytes added)
    seen = set()
    for e in stage_events(info.schedule, info.stage, info.stages, m):
        second = e.done > 0  # the second collected microbatch holds the first one's gradients (and input gradient)
        extra = ((e.input_grads - int(second)) * info.input_grad_bytes + e.sent_outputs * output_bytes
                 + (m - 1) * info.buffer_bytes)
        key = ((e.phase, 1 + int(second)), e.held, extra)
        if key in seen:
            continue  # the same memory as an event already laid out
        seen.add(key)
        parts.append((source[key[0]], e.microbatch, e.held, extra + e.held * info.held_bytes))
    # the optimizer step: the schedule has returned (no send kept), every microbatch's buffers still there
    parts.append((np.flatnonzero(phases == "optimizer"), 0, 0,
                  (m - 1) * info.buffer_bytes - info.input_grad_bytes))
    idx = np.concatenate([p[0] for p in parts])
    held = np.concatenate([np.full(len(p[0]), p[2], dtype=np.float64) for p in parts])
    added = np.concatenate([np.full(len(p[0]), p[3], dtype=np.float64) for p in parts])
    root = min(model.post_pos, key=lambda f: f.count("."))
    repeats = {f: np.asarray(model.repeats.get(f, np.zeros(len(phases))))[idx] + held
               for f in model.post_pos if f != root}
    kinds = {k: v[idx] for k, v in model.base_by_kind.items()}
    if "activations" in kinds:
        kinds["activations"] = kinds["activations"] + added
    micro_out = tuple(int(j) if j else None for p in parts for j in [p[1]] * len(p[0]))
    note = (f"{model.note}; pipeline stage {info.stage} of {info.stages}, {info.schedule}, {m} microbatches "
            f"(up to {in_flight(info.schedule, info.stage, info.stages, m)} in flight)")
    return replace(model, note=note, keys=model.keys[idx], base_bytes=model.base_bytes[idx] + added,
                   phases=tuple(phases[idx]), modules=tuple(model.modules[i] for i in idx),
                   repeats=repeats, repeats_held={f: np.asarray(v)[idx] for f, v in model.repeats_held.items()},
                   micro_batches=micro_out, grad_accumulation=m, base_by_kind=kinds)

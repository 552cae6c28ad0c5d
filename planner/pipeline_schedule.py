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
from typing import Any

import numpy as np

__all__ = ["stage_events", "in_flight", "schedule_stage_model"]


def stage_events(schedule: str, stage: int, stages: int, microbatches: int) -> list[tuple[str, int, int, int]]:
    """Stage ``stage``'s forwards and backwards in order, each (phase, microbatch from 1, other microbatches held
    between their forward and backward then, backwards done before it)."""
    m = microbatches
    if schedule == "gpipe":  # every forward, then every backward
        order = [("forward", j) for j in range(1, m + 1)] + [("backward", j) for j in range(1, m + 1)]
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
    events, open_, done = [], 0, 0
    for phase, j in order:
        if phase == "forward":
            events.append((phase, j, open_, done))
            open_ += 1
        else:
            open_ -= 1
            events.append((phase, j, open_, done))
            done += 1
    return events


def in_flight(schedule: str, stage: int, stages: int, microbatches: int) -> int:
    """The most microbatches stage ``stage`` holds at once (forward done or running, backward not done)."""
    return max(held + 1 for _, _, held, _ in stage_events(schedule, stage, stages, microbatches))


def schedule_stage_model(model: Any, info: Any) -> Any:
    """The memory model of a stage's whole step from the model of its two collected microbatches (see above)."""
    m = info.microbatches
    micro = np.array([t or 0 for t in model.micro_batches])
    phases = np.array(model.phases)
    source = {(p, k): np.flatnonzero((phases == p) & (micro == k)) for p in ("forward", "backward") for k in (1, 2)}
    parts: list[tuple[np.ndarray, int, int, int]] = []  # (moment indices, microbatch, held, extra input grads)
    seen = set()
    for phase, j, held, done in stage_events(info.schedule, info.stage, info.stages, m):
        take = (phase, 1 if done == 0 else 2)
        extra = max(0, done - 1)
        if (take, held, extra) in seen:
            continue  # the same memory as an event already laid out
        seen.add((take, held, extra))
        parts.append((source[take], j, held, extra))
    parts.append((np.flatnonzero(phases == "optimizer"), 0, 0, m - 1))  # every microbatch's input gradient
    idx = np.concatenate([p[0] for p in parts])
    held = np.concatenate([np.full(len(p[0]), p[2], dtype=np.float64) for p in parts])
    extra = np.concatenate([np.full(len(p[0]), p[3], dtype=np.float64) for p in parts])
    added = held * info.held_bytes + extra * info.input_grad_bytes + (m - 1) * info.buffer_bytes
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

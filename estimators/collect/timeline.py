"""The step's memory over time: per phase and key, the instant of most live memory.

The recorder watches every new storage of the fake step (peaks happen right
after allocations) and keeps, per phase and per count of module events so
far, the instant of most total live memory with its breakdown. Counts of
events, not stats keys, because which modules the stats keep is known only
when the step is over (modules run out of place are left out):
:meth:`TimelineRecorder.moments` turns counts into keys over the final
``fw_post_order`` (and counts of later calls in effect, for modules called
more than once), keeping the larger instant where two counts share them.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass

from estimators.common import GRAD, OPT, PARAM

__all__ = ["TimelineRecorder", "FORWARD", "BACKWARD", "OPTIMIZER"]

FORWARD, BACKWARD, OPTIMIZER = "forward", "backward", "optimizer"


@dataclass(frozen=True)
class Instant:
    """Live bytes at one instant, and the modules running then (innermost last)."""

    total_bytes: int
    activation_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    running: tuple[str, ...]


class TimelineRecorder:
    """Per (phase, count of module events so far), the instant of most live memory.

    ``running()`` gives the fqns of the modules running, innermost last; it is
    asked only when an instant beats the one kept. Forward events are modules
    finishing a forward call, backward events modules starting their backward
    (and, for calls after a module's first, ending it); the optimizer phase
    has none. A module's first call sets the moments' keys; its later calls
    (a shared layer applied again) are counted per moment in
    ``repeat_calls_discarding`` and ``repeat_calls_in_backward``.
    """

    def __init__(self, running: Callable[[], Sequence[str]]):
        self.running = running
        self.phase = FORWARD
        self.micro_batch: int | None = None  # with gradient accumulation: the micro-batch running, from 1
        # per (micro-batch, phase), its events in step order: (kind, fqn); kinds: _FIRST (a first call finishing
        # its forward, or starting its backward), _REPEAT (a later call doing so), _REPEAT_END (a later call's
        # backward ending)
        self.events: dict[tuple[int | None, str], list[tuple[str, str]]] = {(None, FORWARD): [], (None, BACKWARD): []}
        self._best: dict[tuple[int | None, str, int], Instant] = {}

    def enter(self, phase: str) -> None:
        self.phase = phase
        if phase == OPTIMIZER:
            self.micro_batch = None

    def start_micro_batch(self, k: int) -> None:
        """Micro-batch ``k`` (from 1) of a step with gradient accumulation begins its forward: its moments are keyed
        by its own module events (each micro-batch discards and recomputes as the first)."""
        self.micro_batch, self.phase = k, FORWARD
        self.events.pop((None, FORWARD), None)
        self.events.pop((None, BACKWARD), None)
        self.events[(k, FORWARD)], self.events[(k, BACKWARD)] = [], []

    def _add(self, phase: str, kind: str, fqn: str) -> None:
        self.events[(self.micro_batch, phase)].append((kind, fqn))

    def forward_finished(self, fqn: str) -> None:
        self._add(FORWARD, _FIRST, fqn)

    def backward_started(self, fqn: str) -> None:
        self._add(BACKWARD, _FIRST, fqn)

    def repeat_forward_finished(self, fqn: str) -> None:
        """A call of ``fqn`` after its first finished its forward."""
        self._add(FORWARD, _REPEAT, fqn)

    def repeat_backward_started(self, fqn: str) -> None:
        self._add(BACKWARD, _REPEAT, fqn)

    def repeat_backward_ended(self, fqn: str) -> None:
        self._add(BACKWARD, _REPEAT_END, fqn)

    def _count(self) -> int:
        return len(self.events.get((self.micro_batch, self.phase), ()))

    def position(self) -> tuple[int | None, int]:
        """(micro-batch, events of its phase so far): where the step is now, for :meth:`backward_key`."""
        return self.micro_batch, self._count()

    def backward_key(self, position: tuple[int | None, int], fw_post_order: Sequence[str]) -> int:
        """The key of the backward moment a :meth:`position` taken in the backward falls in."""
        micro_batch, count = position
        return self._states_of(micro_batch, fw_post_order)[BACKWARD][count][0]

    def forward_keys(self, fw_post_order: Sequence[str]) -> list[int]:
        """The first micro-batch's forward: per count of its events so far, the key of its moment."""
        micro_batch = 1 if (1, FORWARD) in self.events else None
        if (micro_batch, FORWARD) not in self.events:
            return []
        return [state[0] for state in self._states_of(micro_batch, fw_post_order)[FORWARD]]

    def _states_of(self, micro_batch: int | None, fw_post_order: Sequence[str]) -> dict[str, list[tuple]]:
        """Per phase of ``micro_batch``, per count of its events, its state (the key first), as :func:`_states`."""
        events = {ph: self.events[(micro_batch, ph)] for ph in (FORWARD, BACKWARD)}
        return _states(events, {f: i for i, f in enumerate(fw_post_order)}, ())

    def on_alloc(self, category: str, live: dict[str, int]) -> None:
        """A :attr:`StorageBook.on_alloc` callback: keep the instant if it is the most memory of its count."""
        total = sum(live.values())
        at = (self.micro_batch, self.phase, self._count())
        best = self._best.get(at)
        if best is None or total > best.total_bytes:
            other = live[PARAM] + live[GRAD] + live[OPT]
            self._best[at] = Instant(total, total - other, live[GRAD], live[OPT], tuple(self.running()))

    def moments(self, fw_post_order: Sequence[str], per_call: Container[str] = ()) -> list[dict]:
        """The moments in step order as stats v1 ``Moment`` fields, keyed over the final ``fw_post_order``.

        Forward key: how many of its modules have finished. Backward key: the
        smallest position among its modules whose backward has started, or
        their number if none has. Optimizer key: 0. ``module``: the innermost
        running module the stats keep, or null. Later calls are counted for
        the modules in ``per_call`` only. With gradient accumulation every
        micro-batch's moments are keyed by its own events (``micro_batch``).
        """
        position = {fqn: i for i, fqn in enumerate(fw_post_order)}
        micro_batches = {mb for mb, _ in self.events}
        states = {mb: _states({ph: self.events[(mb, ph)] for ph in (FORWARD, BACKWARD)}, position, per_call)
                  for mb in micro_batches}
        merged: dict[tuple, Instant] = {}
        for (mb, phase, count), instant in self._best.items():  # insertion order is step order
            at = (mb, phase) + (states[mb][phase][count] if mb in states and phase in states[mb] else (0, (), ()))
            if at not in merged or instant.total_bytes > merged[at].total_bytes:
                merged[at] = instant
        return [
            {"phase": phase, "key": key, "module": next((f for f in reversed(i.running) if f in position), None),
             "activation_bytes": i.activation_bytes, "grad_bytes": i.grad_bytes, "optimizer_bytes": i.optimizer_bytes,
             "micro_batch": mb, "repeat_calls_discarding": dict(discarding), "repeat_calls_in_backward": dict(in_backward)}
            for (mb, phase, key, discarding, in_backward), i in merged.items()
        ]


_FIRST, _REPEAT, _REPEAT_END = "first", "repeat", "repeat_end"


def _states(events: dict[str, list[tuple[str, str]]], position: dict[str, int],
            per_call: Container[str]) -> dict[str, list[tuple]]:
    """Per phase, after each count of its events: (key, later calls discarding, later calls in their backward),
    the two as sorted (fqn, count) tuples without zeros."""
    key = {FORWARD: 0, BACKWARD: len(position)}
    discarding: dict[str, int] = {}
    in_backward: dict[str, int] = {}

    def state(phase: str) -> tuple:
        return (key[phase], tuple(sorted((f, c) for f, c in discarding.items() if c)),
                tuple(sorted((f, c) for f, c in in_backward.items() if c)))

    out: dict[str, list[tuple]] = {}
    for phase in (FORWARD, BACKWARD):  # the forward's later calls still discard when the backward begins
        out[phase] = [state(phase)]
        for kind, fqn in events[phase]:
            kept = fqn in position
            if kind == _FIRST and phase == FORWARD:
                key[phase] += kept
            elif kind == _FIRST:
                key[phase] = min(key[phase], position.get(fqn, len(position)))
            elif kept and fqn in per_call and kind == _REPEAT and phase == FORWARD:
                discarding[fqn] = discarding.get(fqn, 0) + 1
            elif kept and fqn in per_call and kind == _REPEAT:
                discarding[fqn] = max(0, discarding.get(fqn, 0) - 1)
                in_backward[fqn] = in_backward.get(fqn, 0) + 1
            elif kept and fqn in per_call:
                in_backward[fqn] = max(0, in_backward.get(fqn, 0) - 1)
            out[phase].append(state(phase))
    return out

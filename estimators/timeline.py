"""The step's memory over time: per phase and key, the instant of most live memory.

The recorder watches every new storage of the fake step (peaks happen right
after allocations) and keeps, per phase and per count of module events so
far, the instant of most total live memory with its breakdown. Counts of
events, not stats keys, because which modules the stats keep is known only
when the step is over (modules run out of place are left out):
:meth:`TimelineRecorder.moments` turns counts into keys over the final
``fw_post_order``, keeping the larger instant where two counts share a key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from estimators.tracking import GRAD, OPT, PARAM

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
    finishing their (first) forward, backward events modules starting their
    backward; the optimizer phase has none.
    """

    def __init__(self, running: Callable[[], Sequence[str]]):
        self.running = running
        self.phase = FORWARD
        self.fw_finished: list[str] = []
        self.bw_started: list[str] = []
        self._best: dict[tuple[str, int], Instant] = {}

    def enter(self, phase: str) -> None:
        self.phase = phase

    def forward_finished(self, fqn: str) -> None:
        self.fw_finished.append(fqn)

    def backward_started(self, fqn: str) -> None:
        self.bw_started.append(fqn)

    def _count(self) -> int:
        if self.phase == FORWARD:
            return len(self.fw_finished)
        return len(self.bw_started) if self.phase == BACKWARD else 0

    def on_alloc(self, category: str, live: dict[str, int]) -> None:
        """A :attr:`StorageBook.on_alloc` callback: keep the instant if it is the most memory of its count."""
        total = sum(live.values())
        at = (self.phase, self._count())
        best = self._best.get(at)
        if best is None or total > best.total_bytes:
            other = live[PARAM] + live[GRAD] + live[OPT]
            self._best[at] = Instant(total, total - other, live[GRAD], live[OPT], tuple(self.running()))

    def moments(self, fw_post_order: Sequence[str]) -> list[dict]:
        """The moments in step order as stats v1 ``Moment`` fields, keyed over the final ``fw_post_order``.

        Forward key: how many of its modules have finished. Backward key: the
        smallest position among its modules whose backward has started, or
        their number if none has. Optimizer key: 0. ``module``: the innermost
        running module the stats keep, or null.
        """
        position = {fqn: i for i, fqn in enumerate(fw_post_order)}
        keys = {FORWARD: [0], BACKWARD: [len(position)]}  # the key after each count of events
        for fqn in self.fw_finished:
            keys[FORWARD].append(keys[FORWARD][-1] + (fqn in position))
        for fqn in self.bw_started:
            keys[BACKWARD].append(min(keys[BACKWARD][-1], position.get(fqn, len(position))))
        merged: dict[tuple[str, int], Instant] = {}
        for (phase, count), instant in self._best.items():  # insertion order is step order
            at = (phase, keys[phase][count] if phase in keys else 0)
            if at not in merged or instant.total_bytes > merged[at].total_bytes:
                merged[at] = instant
        return [
            {"phase": phase, "key": key, "module": next((f for f in reversed(i.running) if f in position), None),
             "activation_bytes": i.activation_bytes, "grad_bytes": i.grad_bytes, "optimizer_bytes": i.optimizer_bytes}
            for (phase, key), i in merged.items()
        ]

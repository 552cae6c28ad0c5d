"""Calls of a module after its first (a shared layer applied again, a submodule its parent calls twice).

The collector describes each module by its first call; checkpointed, every
call discards and recomputes alike. What the memory model needs of the later
calls is when each one's discard is in effect (from the end of its forward
until its backward starts) and when it is in its own backward (holding its
inputs): :class:`RepeatCalls` tells the :class:`TimelineRecorder` those
events, for non-leaf modules, and notes the modules whose later calls save
other amounts than their first (other shapes), which the stats then describe
by their first call alone.
"""

from __future__ import annotations

from typing import Any

import torch

from estimators.collect.timeline import TimelineRecorder
from estimators.common import ACT, StorageBook, storages_of, tensors_in

__all__ = ["RepeatCalls"]


class RepeatCalls:
    """Later forward calls of modules, as they run; ``differ``: modules whose later calls save other amounts."""

    def __init__(self, book: StorageBook, timeline: TimelineRecorder):
        self.book, self.timeline = book, timeline
        self._open: list[int] = []  # live activation bytes when each running later call began
        self.differ: set[str] = set()

    def started(self, fqn: str, is_leaf: bool, args: Any) -> None:
        """A later call of ``fqn`` begins: its backward ends when its inputs have their gradients."""
        self._open.append(self.book.live[ACT])
        grads = [t for t in tensors_in(args) if t.requires_grad]
        if grads and not is_leaf:
            torch.autograd.graph.register_multi_grad_hook(
                grads, lambda _g, f=fqn: self.timeline.repeat_backward_ended(f))

    def finished(self, fqn: str, is_leaf: bool, first_saved_bytes: int, output: Any) -> None:
        """A later call of ``fqn`` ends its forward (``first_saved_bytes``: what its first call saved)."""
        before = self._open.pop()
        if is_leaf:
            return
        out_bytes = sum(self.book.nbytes(s) for s in storages_of(output))
        if max(0, self.book.live[ACT] - before - out_bytes) != first_saved_bytes:
            self.differ.add(fqn)
        self.timeline.repeat_forward_finished(fqn)
        outs = [t for t in tensors_in(output) if t.requires_grad]
        if outs:
            torch.autograd.graph.register_multi_grad_hook(
                outs, lambda _g, f=fqn: self.timeline.repeat_backward_started(f), mode="any")

"""The progress display of ``sacplan collect``: tqdm bars on a terminal, one plain line per phase in a log.

The collector reports ``(phase, done, total)``; ``total`` 0 means not known
in advance (building the model counts modules as they are made). tqdm draws
with carriage returns, which a log file keeps as one line of fragments, so
when the stream is not a terminal each phase writes one line when it ends.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

__all__ = ["CollectProgress", "PHASES"]

# phase -> (label, what it counts; None: a step with nothing to count)
PHASES: dict[str, tuple[str, str | None]] = {
    "building": ("building the model", "modules"),
    "forward": ("forward", "modules"),
    "backward": ("backward", "modules"),
    "optimizer": ("optimizer step", None),
    "overhead": ("checkpoint overhead", "modules"),
}


class CollectProgress:
    """A ``progress(phase, done, total)`` callable; ``close()`` ends the last phase."""

    def __init__(self, *, quiet: bool = False, stream: IO[str] | None = None, terminal: bool | None = None):
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stderr
        self.terminal = _isatty(self.stream) if terminal is None else terminal
        self.phase: str | None = None
        self.done = 0
        self.started = 0.0
        self.bar: Any = None
        self.counts: dict[str, int] = {}  # finished phase -> its count

    def __call__(self, phase: str, done: int, total: int) -> None:
        if self.quiet:
            return
        if phase != self.phase:
            self.close()
            self._open(phase, total)
        self.done = done
        if self.bar is not None:
            if total and self.bar.total != total:
                self.bar.total = total
            self.bar.update(done - self.bar.n)

    def _open(self, phase: str, total: int) -> None:
        self.phase, self.done, self.started = phase, 0, time.perf_counter()
        label, unit = PHASES.get(phase, (phase, "modules"))
        if self.terminal and unit is not None:
            from tqdm import tqdm

            self.bar = tqdm(total=total or None, desc=f"  {label}", unit=f" {unit}", file=self.stream, leave=True,
                            dynamic_ncols=True, mininterval=0.1)

    def close(self) -> None:
        """End the current phase: its bar stays as a finished line, or its one line is written."""
        if self.phase is None:
            return
        label, unit = PHASES.get(self.phase, (self.phase, "modules"))
        seconds = time.perf_counter() - self.started
        self.counts[self.phase] = self.done
        ran = self.counts.get("forward", 0)
        if self.phase == "backward" and self.done < ran:  # e.g. rotary embeddings: their outputs need no gradient
            none = ran - self.done
            label += f" ({none} of the {ran} modules {'has' if none == 1 else 'have'} no gradient to compute)"
        if self.bar is not None:
            self.bar.total = self.done  # modules that never run (containers) or have no backward are not waited for
            self.bar.set_description(f"  {label}", refresh=True)
            self.bar.close()
            self.bar = None
        else:
            counted = f": {self.done} {unit}" if unit is not None else ""
            self.stream.write(f"  {label}{counted} ({seconds:.1f} s)\n")
            self.stream.flush()
        self.phase = None

    def note(self, text: str) -> None:
        """A line of its own (ends the current phase first)."""
        if self.quiet:
            return
        self.close()
        self.stream.write(text + "\n")
        self.stream.flush()


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False

"""A table of linked decisions: how the list searches remember which plan each state stands for."""

from __future__ import annotations

import numpy as np

__all__ = ["TraceTable"]


class TraceTable:
    """Entries (previous entry, candidate, frontier point); a plan is the walk back from one entry.

    A state of a search carries one entry id (-1: nothing chosen yet), so
    states share their common past instead of copying it.
    """

    def __init__(self) -> None:
        self.size = 0
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._joined: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def add(self, prev: np.ndarray, cand: np.ndarray, point: np.ndarray) -> np.ndarray:
        """Append one entry per element; returns their ids."""
        ids = np.arange(self.size, self.size + len(prev))
        self._parts.append((prev, cand, point))
        self._joined = None
        self.size += len(prev)
        return ids

    def choices(self, entry: int) -> dict[int, int]:
        """Candidate -> frontier point of the plan ending at ``entry``."""
        if self._joined is None:
            empty = np.zeros(0, np.int64)
            self._joined = tuple(np.concatenate([p[k] for p in self._parts]) if self._parts else empty
                                 for k in range(3))
        prev, cand, point = self._joined
        out = {}
        while entry >= 0:
            out[int(cand[entry])] = int(point[entry])
            entry = int(prev[entry])
        return out

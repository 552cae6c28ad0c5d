"""Jobs for the solver pool tests, importable by a spawned solver process."""

from __future__ import annotations

import os
import time

_held: list[bytes] = []


def pid() -> int:
    return os.getpid()


def grow(mib: int, hold_s: float = 0.0) -> int:
    """Touch ``mib`` MiB (kept by the process after the job), wait ``hold_s``; the process id."""
    _held.append(b"x" * (mib * 2**20))
    time.sleep(hold_s)
    return os.getpid()

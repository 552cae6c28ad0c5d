"""Jobs for the solver pool tests, importable by a spawned solver process."""

from __future__ import annotations

import os
import sys
import time

_held: list[bytes] = []


def pid() -> int:
    return os.getpid()


def grow(mib: int, hold_s: float = 0.0) -> int:
    """Touch ``mib`` MiB (kept by the process after the job), wait ``hold_s``; the process id."""
    _held.append(b"x" * (mib * 2**20))
    time.sleep(hold_s)
    return os.getpid()


def niceness_and_modules(*names: str) -> tuple[int, int, list[bool]]:
    """This process's pid, its niceness, and whether each module is imported in it."""
    return os.getpid(), os.nice(0), [name in sys.modules for name in names]

"""``scipy.optimize.milp`` with HiGHS's console noise kept off stdout.

scipy runs HiGHS with its console log off (``disp`` False), yet some HiGHS
builds still print development lines straight from C with ``printf``, which no
option silences: ``HighsMipSolverData::transformNewIntegerFeasibleSolution
tmpSolver.run();`` on some MoE stats (the same line HiGHS.jl users see with
every output option off: jump-dev/HiGHS.jl issue 312). In library use that
would land in the caller's stdout, in the middle of ``sacplan plan --json``.

So each solve runs with file descriptor 1 pointed at descriptor 2: whatever
C writes goes to stderr, nothing is lost, stdout stays the caller's. C's own
stdout buffer is flushed before descriptor 1 is restored (a buffered
``printf`` would otherwise reach the real stdout later). The redirection is
process-wide, so Python code in other threads that writes to stdout during a
solve writes to stderr too; nested and concurrent solves share one
redirection (a counter under a lock).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

from scipy.optimize import milp

__all__ = ["quiet_milp", "stdout_to_stderr"]

_lock = threading.Lock()
_depth = 0
_saved_fd: int | None = None


def quiet_milp(*args: Any, **kwargs: Any) -> Any:
    """``scipy.optimize.milp(*args, **kwargs)`` with anything HiGHS prints sent to stderr."""
    with stdout_to_stderr():
        return milp(*args, **kwargs)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Descriptor 1 points at descriptor 2 inside the block (process-wide; re-entrant, thread-safe)."""
    global _depth, _saved_fd
    with _lock:
        if _depth == 0:
            _saved_fd = _redirect()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved_fd is not None:
                _restore(_saved_fd)
                _saved_fd = None


def _redirect() -> int | None:
    """Point fd 1 at fd 2; the saved fd 1, or None where either is not open (nothing is redirected)."""
    _flush_all()
    try:
        saved = os.dup(1)
    except OSError:
        return None
    try:
        os.dup2(2, 1)
    except OSError:
        os.close(saved)
        return None
    return saved


def _restore(saved: int) -> None:
    _flush_all()
    os.dup2(saved, 1)
    os.close(saved)


def _flush_all() -> None:
    """Python's and C's stdout buffers, so each line reaches the descriptor it was written under."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    with contextlib.suppress(Exception):
        _libc().fflush(None)


_LIBC: list[Any] = []


def _libc() -> Any:
    if not _LIBC:
        _LIBC.append(ctypes.CDLL(None))  # the process's own C library (POSIX); absent on Windows: no C flush
    return _LIBC[0]

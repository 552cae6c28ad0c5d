"""``scipy.optimize.milp`` with HiGHS's console noise captured and logged, never on the terminal.

scipy runs HiGHS with its console log off (``disp`` False), yet some HiGHS
builds still print development lines straight from C with ``printf``, which no
option silences: ``HighsMipSolverData::transformNewIntegerFeasibleSolution
tmpSolver.run();`` on some MoE stats and long sequences (the same line HiGHS.jl
users see with every output option off: jump-dev/HiGHS.jl issue 312). In
library use that would land in the caller's stdout, in the middle of
``sacplan plan --json``; sent to stderr instead, it still reached the terminal.

So each solve runs with file descriptor 1 pointed at a temporary file: when
the solve ends, C's stdout buffer is flushed (a buffered ``printf`` would
otherwise reach the real stdout later), descriptor 1 is restored and what was
written is logged line by line at debug level on the ``planner.highs`` logger
(``logging.getLogger("planner.highs").setLevel(logging.DEBUG)`` shows it). The
redirection is process-wide, so Python code in other threads that writes to
stdout during a solve is logged the same way; nested and concurrent solves
share one redirection (a counter under a lock).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

from scipy.optimize import milp

__all__ = ["quiet_milp", "stdout_logged"]

log = logging.getLogger("planner.highs")

_lock = threading.Lock()
_depth = 0
_saved: tuple[int, Any] | None = None  # the real fd 1 and the file standing in for it


def quiet_milp(*args: Any, **kwargs: Any) -> Any:
    """``scipy.optimize.milp(*args, **kwargs)`` with anything HiGHS prints logged at debug level."""
    with stdout_logged():
        return milp(*args, **kwargs)


@contextlib.contextmanager
def stdout_logged() -> Iterator[None]:
    """Descriptor 1 points at a temporary file inside the block, logged at debug level after it (process-wide;
    re-entrant, thread-safe)."""
    global _depth, _saved
    with _lock:
        if _depth == 0:
            _saved = _redirect()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved is not None:
                _restore(*_saved)
                _saved = None


def _redirect() -> tuple[int, Any] | None:
    """Point fd 1 at a temporary file; the saved fd 1 and the file, or None where that fails (nothing changes)."""
    _flush_all()
    try:
        sink = tempfile.TemporaryFile()
    except OSError:
        return None
    try:
        saved = os.dup(1)
    except OSError:
        sink.close()
        return None
    try:
        os.dup2(sink.fileno(), 1)
    except OSError:
        os.close(saved)
        sink.close()
        return None
    return saved, sink


def _restore(saved: int, sink: Any) -> None:
    _flush_all()
    os.dup2(saved, 1)
    os.close(saved)
    with sink:
        sink.seek(0)
        text = sink.read().decode(errors="replace")
    for line in text.splitlines():
        if line.strip():
            log.debug("HiGHS: %s", line)


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

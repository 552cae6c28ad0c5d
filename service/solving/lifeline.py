"""Worker processes that die with the process that started them.

A solver process is spawned by the service process; if that one is killed
(``kill -9``, the OOM killer), nothing told the solver, which (and with it
multiprocessing's resource tracker, kept alive by the solver's end of its
pipe) ran on as an orphan. A daemon thread in the worker watches its parent:
once it is gone (the worker has been handed to another parent), the worker
kills itself.
"""

from __future__ import annotations

import os
import signal
import threading
import time

__all__ = ["die_with_parent"]


def die_with_parent(parent_pid: int, poll_s: float = 0.25) -> threading.Thread:
    """Start the watch in this (worker) process for ``parent_pid``, the process that spawned it; returns its thread.

    The pid comes from the parent: a parent killed while the worker was still
    starting is then noticed too (``os.getppid()`` would already be the new parent).

    Polling, not ``PR_SET_PDEATHSIG``: that signal follows the parent *thread*
    that spawned the worker, and a pool may be respawned from any thread. The
    watch needs the interpreter lock, so a solver inside one long C call
    (a single HiGHS solve) notices when that call returns.
    """
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="die-with-parent", daemon=True)
    thread.start()
    return thread

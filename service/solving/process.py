"""The solver process's side: its main loop, and the plan job it runs.

This module imports only the standard library at the top: a solver process is
spawned with it as its entry point, and nothing heavy (numpy, scipy, the
planner) loads before the process has set itself up.

The protocol over the pipe (one job at a time): the service sends
``(fn, args)``; the process answers any number of ``("partial", item)`` (a sweep's
finished points, as they finish) and then one ``("done", result, rss_bytes)`` or
``("failed", message, rss_bytes)``.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from functools import lru_cache
from typing import Any

__all__ = ["process_main", "solve_job", "rss_bytes"]

_report = None  # set in a solver process: sends one ("partial", item) message to the service


def rss_bytes(pid: int | str = "self") -> int | None:
    """Resident memory of process ``pid`` (Linux /proc), None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    import os

    return pages * os.sysconf("SC_PAGE_SIZE")


def process_main(conn, service_pid: int) -> None:
    """A solver process for the service process ``service_pid``: run jobs from ``conn`` until it closes."""
    global _report
    # A Ctrl-C reaches the whole process group: the service stops its solver processes itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from service.solving.lifeline import die_with_parent

    die_with_parent(service_pid)  # a killed service leaves no solver (nor resource tracker) behind
    import planner  # noqa: F401  (numpy/scipy imported once per process, not per solve)

    _report = lambda item: conn.send(("partial", item))  # noqa: E731
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            result = fn(*args)
        except Exception as exc:  # a job's own failure; the process stays usable
            logging.getLogger(__name__).exception("solver job failed")
            conn.send(("failed", f"{type(exc).__name__}: {exc}", rss_bytes()))
            continue
        conn.send(("done", result, rss_bytes()))


def noop() -> None:
    return None


@lru_cache(maxsize=4)
def _parse(document: str):
    import planner

    return planner.parse_stats(json.loads(document))


def solve_job(document: str, budgets_gib: list[float], options: dict[str, Any]) -> dict[str, Any]:
    """Plan the canonical stats ``document`` at each budget (solver side).

    ``options["time_limit_s"]`` is what is left of the request's time limit when
    the job starts: reading the stats counts against it, and a sweep shares it
    across its budgets. Reports ``{"base": {...}}`` (the no-plan figures) once
    the stats are read, and ``{"point": i, "plan": ...}`` as each budget is done,
    so a job stopped at its deadline still answers with what it finished.

    Returns ``{"plans": [plan dicts]}``; ``{"invalid": message}`` when the
    planner rejects a request field (ValueError), so the service answers 422;
    ``{"stored_stats_invalid": message, "errors": [...]}`` when this planner's
    validation rejects the stored document itself (stored by an older planner: 409).
    A planner crash becomes plans with status ``error`` (never stored).
    """
    import planner
    from planner import baseline_peak_bytes, compute_ms

    started = time.perf_counter()
    try:
        stats = _parse(document)
    except planner.StatsError as exc:
        return {"stored_stats_invalid": str(exc), "errors": exc.errors}
    world_size = options.get("world_size", 1)
    try:
        base = {"world_size": world_size, "baseline_peak_bytes": baseline_peak_bytes(stats, world_size=world_size),
                "compute_ms": compute_ms(stats), "planner_version": planner.PLANNER_VERSION}
    except ValueError as exc:
        return {"invalid": str(exc)}
    if _report is not None:
        _report({"base": base})
    left_s = options["time_limit_s"] - (time.perf_counter() - started)
    options = {**options, "time_limit_s": max(left_s, 1e-3)}

    def progress(i: int, _n: int, plan) -> None:
        if _report is not None:
            _report({"point": i, "plan": plan.model_dump(mode="json")})

    try:
        plans = planner.sweep(stats, budgets_gib, progress=progress, **options)
    except ValueError as exc:
        return {"invalid": str(exc)}
    except Exception as exc:  # the planner failed: say so, as the plan format allows
        logging.getLogger(__name__).exception("planner failed")
        failed = {**base, "status": "error", "message": f"{type(exc).__name__}: {exc}"}
        return {"plans": [dict(failed, memory_budget_gib=b) for b in budgets_gib]}
    return {"plans": [p.model_dump(mode="json") for p in plans]}

"""Solves off the event loop: a bounded process pool with single-flight per cache key.

Solver processes are spawned (not forked: the service has threads) and reused.
At most ``workers + queue_size`` solves are running or waiting; one more gets
:class:`SolverBusy` (503 + Retry-After). Concurrent requests for the same key
share one solve.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import lru_cache
from typing import Any, TypeVar

from service.errors import SolverBusy, SolverFailed
from service.lifeline import die_with_parent

__all__ = ["SolverPool", "solve_job"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class SolverPool:
    """Runs solver jobs in worker processes; never blocks the event loop."""

    def __init__(self, workers: int = 1, queue_size: int = 8, retry_after_s: int = 5):
        self.workers = workers
        self.capacity = workers + queue_size
        self.retry_after_s = retry_after_s
        self.in_flight = 0
        self.solves_started = 0
        self._executor: Executor | None = None
        self._flights: dict[str, asyncio.Future[Any]] = {}

    def _pool(self) -> Executor:
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_warm_up,
                initargs=(os.getpid(),),
            )
        return self._executor

    def start(self) -> None:
        """Start the worker processes now instead of on the first solve."""
        pool = self._pool()
        for _ in range(self.workers):
            pool.submit(_noop)

    def shutdown(self, wait: bool = True, grace_s: float = 5.0) -> None:
        """Stop the workers; queued solves are cancelled.

        With ``wait`` (service shutdown), a running solve gets ``grace_s`` seconds,
        then its process is killed; either way the processes are joined and the
        pool's queues released before this returns. Not waiting left them to the
        interpreter's exit, which a SIGTERM skips: "leaked semaphore objects".
        """
        executor, self._executor = self._executor, None
        if executor is None:
            return
        if not wait:
            executor.shutdown(wait=False, cancel_futures=True)
            return
        processes = list((getattr(executor, "_processes", None) or {}).values())
        stopping = threading.Thread(target=executor.shutdown, kwargs={"wait": True, "cancel_futures": True},
                                    name="solver-pool-shutdown")
        stopping.start()
        stopping.join(grace_s)
        if stopping.is_alive():
            log.warning("a solve still running after %.0f s at shutdown: killing its process", grace_s)
            for process in processes:  # the workers ignore SIGTERM (see _warm_up): kill
                process.kill()
            stopping.join()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in a worker process, or raise SolverBusy when the queue is full."""
        if self.in_flight >= self.capacity:
            raise SolverBusy(self.retry_after_s)
        self.in_flight += 1
        self.solves_started += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._pool(), fn, *args)
        except BrokenProcessPool:
            log.error("a solver process died; restarting the pool")
            self.shutdown(wait=False)
            raise SolverFailed("the solver process died (out of memory?); the pool was restarted; retry") from None
        finally:
            self.in_flight -= 1

    async def single_flight(self, key: str, work: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
        """Await ``work()`` once per key at a time; returns (result, joined an existing flight).

        The work runs as its own task: a client hanging up does not cancel a
        solve that others are waiting for or whose result is about to be stored.
        """
        flight = self._flights.get(key)
        if flight is not None:
            return await asyncio.shield(flight), True
        task = asyncio.ensure_future(work())
        self._flights[key] = task
        task.add_done_callback(lambda t: self._land(key, t))
        return await asyncio.shield(task), False

    def _land(self, key: str, task: asyncio.Future[Any]) -> None:
        if self._flights.get(key) is task:
            del self._flights[key]
        if not task.cancelled():
            task.exception()  # retrieved here so an unawaited failure is not logged as lost


# --- runs in the worker processes --------------------------------------------------------------


def _warm_up(service_pid: int) -> None:
    # A Ctrl-C reaches the whole process group: the service stops the workers itself
    # (no traceback per worker). SIGTERM still ends a worker: the pool's own cleanup of
    # a broken pool and an operator's kill of orphans both rely on it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(service_pid)  # a killed service leaves no solver (nor resource tracker) behind
    import planner  # noqa: F401  (pay numpy/scipy import once per worker, not per solve)


def _noop() -> None:
    return None


@lru_cache(maxsize=8)
def _parse(document: str):
    import json

    import planner

    return planner.parse_stats(json.loads(document))


def solve_job(document: str, budgets_gib: list[float], options: dict[str, Any]) -> dict[str, Any]:
    """Plan the canonical stats ``document`` at each budget (worker side).

    Returns ``{"plans": [plan dicts]}``; ``{"invalid": message}`` when the
    planner rejects a request field (ValueError), so the service answers 422;
    ``{"stored_stats_invalid": message, "errors": [...]}`` when this planner's
    validation rejects the stored document itself (stored by an older planner: 409).
    A planner crash becomes plans with status ``error`` (never stored).
    """
    import planner
    from planner import baseline_peak_bytes, compute_ms

    try:
        stats = _parse(document)
    except planner.StatsError as exc:
        return {"stored_stats_invalid": str(exc), "errors": exc.errors}
    try:
        if len(budgets_gib) == 1:
            plans = [planner.plan(stats, budgets_gib[0], **options)]
        else:
            plans = planner.sweep(stats, budgets_gib, **options)
    except ValueError as exc:
        return {"invalid": str(exc)}
    except Exception as exc:  # the planner failed: say so, as the plan format allows
        logging.getLogger(__name__).exception("planner failed")
        world_size = options.get("world_size", 1)
        base = {
            "status": "error",
            "message": f"{type(exc).__name__}: {exc}",
            "world_size": world_size,
            "baseline_peak_bytes": baseline_peak_bytes(stats, world_size=world_size),
            "compute_ms": compute_ms(stats),
            "planner_version": planner.PLANNER_VERSION,
        }
        return {"plans": [dict(base, memory_budget_gib=b) for b in budgets_gib]}
    return {"plans": [p.model_dump(mode="json") for p in plans]}

"""Solves off the event loop: solver processes with hard deadlines, a memory cap and per-project shares.

Each solver process is spawned (not forked: the service has threads), runs one
job at a time and is reused. What makes a request's ``time_limit_s`` a bound
rather than a wish: a job still running at its deadline plus a grace is
stopped by killing its process, which is replaced. A process whose resident
memory passes ``memory_cap_bytes`` while solving is killed the same way; one
that holds more than ``idle_memory_bytes`` after a job is replaced.

At most ``workers + queue_size`` jobs are running or waiting (503 SolverBusy
beyond that), and at most ``per_project`` of them for one project (429
ProjectBusy, the others unaffected). Concurrent requests for the same key share
one solve (:meth:`SolverPool.single_flight`).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from service import metrics
from service.errors import ProjectBusy, SolverBusy, SolverFailed
from service.solving.process import process_main, rss_bytes

__all__ = ["SolverPool", "SolverStopped"]

log = logging.getLogger(__name__)
T = TypeVar("T")
_WATCH_S = 0.1  # how often a running job's deadline and memory are looked at


class SolverStopped(Exception):
    """A job stopped before it answered: ``reason`` 'time_limit' or 'memory', with what it reported so far."""

    def __init__(self, reason: str, message: str, partials: list[Any]):
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.partials = partials


@dataclass
class _Process:
    process: Any
    conn: Any
    jobs: int = 0

    def alive(self) -> bool:
        return self.process.is_alive()

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.conn.close()


@dataclass
class _Job:
    partials: list[Any] = field(default_factory=list)
    peak_rss_bytes: int = 0


class SolverPool:
    """Runs solver jobs in worker processes; never blocks the event loop."""

    def __init__(self, workers: int = 1, queue_size: int = 8, retry_after_s: int = 5, *,
                 per_project: int | None = None, memory_cap_bytes: int | None = None,
                 idle_memory_bytes: int | None = None, grace_s: float = 1.0):
        self.workers = workers
        self.capacity = workers + queue_size
        self.retry_after_s = retry_after_s
        self.per_project = per_project or self.capacity
        self.memory_cap_bytes = memory_cap_bytes
        self.idle_memory_bytes = idle_memory_bytes
        self.grace_s = grace_s
        self.in_flight = 0
        self.solves_started = 0
        self.peak_rss_bytes = 0  # the largest solver process seen while solving
        self._by_project: Counter[str] = Counter()
        self._idle: list[_Process] = []
        self._all: list[_Process] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._flights: dict[str, asyncio.Future[Any]] = {}
        self._context = multiprocessing.get_context("spawn")

    # --- processes -------------------------------------------------------------------------------

    def _spawn(self) -> _Process:
        parent, child = self._context.Pipe()
        process = self._context.Process(target=process_main, args=(child, os.getpid()), name="sacplan-solver", daemon=True)
        process.start()
        child.close()
        worker = _Process(process, parent)
        self._all.append(worker)
        return worker

    def _retire(self, worker: _Process) -> None:
        if worker in self._all:
            self._all.remove(worker)
        worker.kill()

    def start(self) -> None:
        """Start the worker processes now instead of on the first solve."""
        while len(self._all) < self.workers:
            self._idle.append(self._spawn())

    def shutdown(self, wait: bool = True, grace_s: float = 5.0) -> None:
        """Stop the workers: an idle one at once, one still solving after ``grace_s`` (killed)."""
        deadline = time.monotonic() + (grace_s if wait else 0.0)
        for worker in list(self._all):
            worker.conn.close()  # an idle process sees its pipe close and exits
        for worker in list(self._all):
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                log.warning("a solve still running at shutdown: killing its process")
                worker.process.kill()
                worker.process.join()
        self._all.clear()
        self._idle.clear()

    async def _acquire(self) -> _Process:
        while True:
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    return worker
                self._retire(worker)
            if len(self._all) < self.workers:
                return self._spawn()
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    def _release(self, worker: _Process | None) -> None:
        if worker is not None:
            self._idle.append(worker)
        # wake one waiter, whichever event loop it waits on (tests share one pool across loops)
        while self._waiters:
            waiter = self._waiters.pop(0)
            if not waiter.done():
                waiter.get_loop().call_soon_threadsafe(_wake, waiter)
                return

    # --- jobs ------------------------------------------------------------------------------------

    def admit(self, project: str) -> None:
        """Raise SolverBusy (503) when the queue is full, ProjectBusy (429) when ``project`` has its share."""
        if self.in_flight >= self.capacity:
            raise SolverBusy(self.retry_after_s)
        if self._by_project[project] >= self.per_project:
            raise ProjectBusy(project, self.per_project, self.retry_after_s)

    async def run(self, fn: Callable[..., T], *args: Any, project: str = "default",
                  deadline: float | None = None) -> T:
        """``fn(*args)`` in a worker process; SolverStopped when it passes ``deadline`` (monotonic) + grace.

        Raises SolverBusy or ProjectBusy first when there is no room (see :meth:`admit`).
        """
        self.admit(project)
        self.in_flight += 1
        self._by_project[project] += 1
        metrics.queue_depth(+1)
        worker = None
        try:
            worker = await self._acquire()
            self.solves_started += 1
            metrics.SOLVES_STARTED.inc()
            kind, result, rss = await self._exchange(worker, fn, args, deadline)
            if self.idle_memory_bytes and rss and rss > self.idle_memory_bytes:
                # it keeps what it grew to (allocator arenas, cached stats): the next job gets a fresh process
                metrics.SOLVER_RECYCLED.labels(reason="idle_memory").inc()
                self._retire(worker)
                worker = None
            if kind == "failed":
                raise RuntimeError(result)
            return result
        except (SolverStopped, SolverFailed, asyncio.CancelledError):
            # stopped, dead, or cancelled mid-job (it may hold a half-sent job): never reused
            if worker is not None:
                self._retire(worker)
                worker = None
            raise
        finally:
            self.in_flight -= 1
            self._by_project[project] -= 1
            if not self._by_project[project]:
                del self._by_project[project]
            metrics.queue_depth(-1)
            self._release(worker)

    async def _exchange(self, worker: _Process, fn: Callable[..., Any], args: tuple,
                        deadline: float | None) -> tuple[str, Any, int | None]:
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        job = _Job()
        fd = worker.conn.fileno()
        loop.add_reader(fd, ready.set)
        try:
            await loop.run_in_executor(None, worker.conn.send, (fn, args))  # a large document: off the loop
            while True:
                try:
                    await asyncio.wait_for(ready.wait(), _WATCH_S)
                except TimeoutError:
                    pass
                ready.clear()
                answer = self._read(worker, job)
                if answer is not None:
                    if answer[2]:
                        self.peak_rss_bytes = max(self.peak_rss_bytes, answer[2])
                    return answer
                self._watch(worker, job, deadline)
        finally:
            loop.remove_reader(fd)

    def _read(self, worker: _Process, job: _Job) -> tuple | None:
        try:
            while worker.conn.poll():
                message = worker.conn.recv()
                if message[0] != "partial":
                    return message
                job.partials.append(message[1])
        except (EOFError, OSError):
            raise SolverFailed("the solver process died (out of memory?); it was replaced; retry") from None
        return None

    def _watch(self, worker: _Process, job: _Job, deadline: float | None) -> None:
        if not worker.alive():
            raise SolverFailed("the solver process died (out of memory?); it was replaced; retry")
        rss = rss_bytes(worker.process.pid) or 0
        job.peak_rss_bytes = max(job.peak_rss_bytes, rss)
        self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
        if self.memory_cap_bytes and rss > self.memory_cap_bytes:
            metrics.SOLVER_RECYCLED.labels(reason="memory").inc()
            raise SolverStopped("memory", f"the solve passed the solver's memory cap of "
                                          f"{self.memory_cap_bytes // 2**20} MiB and was stopped", job.partials)
        if deadline is not None and time.monotonic() > deadline + self.grace_s:
            metrics.TIME_LIMIT_STOPS.inc()
            raise SolverStopped("time_limit", "time_limit_s passed before the solve finished: it was stopped",
                                job.partials)

    # --- one solve per key -----------------------------------------------------------------------

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


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


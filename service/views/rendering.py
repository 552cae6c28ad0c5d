"""Heavy answers made off the service process: chart PNGs and the read-back of a stats upload.

Drawing a chart of a large plan, or validating a 55 MB document again to show
its module tree, is seconds of pure-Python work holding the GIL: in a thread
it would stall the event loop (``/healthz`` included) and grow the service
process by gigabytes. Here it runs in a small pool of spawned processes
(``render_workers``, at most ``render_queue_size`` more waiting, 503 beyond),
and charts are kept in a per-process LRU keyed by the row they show.

Render processes are capped and recycled as the solver's are: while a job runs
their resident memory is sampled every 50 ms from here (a job holds the GIL
for seconds inside ``json.loads`` or a validation, so a watcher inside the
process would not run), and a process passing ``memory_cap_bytes`` is killed
(the job answers :class:`~service.errors.RenderMemoryExceeded`; the pool is
made anew). A process holding more than ``idle_memory_bytes`` once its jobs
are done is retired the same way, and each is replaced after a few jobs anyway.

A render process is started ahead of need (``prestart``, the default of the
service: :meth:`Renderer.warm` when the service starts, and again whenever one
is retired), its ``preload`` modules imported, so a request never waits for a process to start (about a second of a
2-core machine, out of a plan request's ``time_limit_s``). Render processes run
at a lower priority (``nice``): the service's event loop (``/healthz``, cached
reads) comes first while they parse and validate a large body.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import multiprocessing
import os
import signal
from collections import OrderedDict
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from service.errors import RenderMemoryExceeded, SolverBusy, SolverFailed, StoredStatsInvalid

__all__ = ["Renderer", "plan_chart_job", "sweep_chart_job", "pipeline_chart_job", "stats_detail_job", "raise_if_stale"]

_JOBS_PER_PROCESS = 20
_WATCH_S = 0.05  # how often the render processes' memory is looked at while a job runs


class Renderer:
    """A bounded process pool for renders, and the chart cache."""

    def __init__(self, workers: int, queue_size: int, retry_after_s: int, cache_entries: int, *,
                 memory_cap_bytes: int | None = None, idle_memory_bytes: int | None = None, nice: int = 0,
                 preload: tuple[str, ...] = (), prestart: bool = False):
        self.workers = workers
        self.prestart = prestart  # a retired process is replaced at once (the service also calls warm() at start)
        self.nice = nice
        self.preload = preload
        self.memory_cap_bytes = memory_cap_bytes
        self.idle_memory_bytes = idle_memory_bytes
        self.peak_rss_bytes = 0  # the largest render process seen while a job ran
        self._killed: dict[int, int] = {}  # job id -> the RSS at which its process was killed for memory
        self._killed_pools: set[int] = set()  # ids of the pools broken by such a kill (cleared when idle)
        self._jobs = 0
        self._running: Any = None
        self._watcher: asyncio.Task | None = None
        self.capacity = workers + queue_size
        self.retry_after_s = retry_after_s
        self.cache_entries = cache_entries
        self.in_flight = 0
        self._executor: ProcessPoolExecutor | None = None
        self._charts: OrderedDict[tuple, bytes] = OrderedDict()

    def _pool(self) -> ProcessPoolExecutor:
        if self._executor is None:
            context = multiprocessing.get_context("spawn")
            # which job each process runs (pid, job id), so that a kill for memory blames the job that grew
            self._running = context.Array("q", 2 * self.workers, lock=False)
            self._executor = ProcessPoolExecutor(self.workers, mp_context=context,
                                                 max_tasks_per_child=_JOBS_PER_PROCESS, initializer=_set_up,
                                                 initargs=(os.getpid(), self._running, context.Value("i", 0),
                                                           self.nice))
        return self._executor

    def warm(self) -> None:
        """Start a render process now (its ``preload`` modules imported), not when a request needs one."""
        executor = self._pool()
        if not self._pids(executor):  # no process yet: a job makes one (the pool starts them as jobs come)
            executor.submit(_preload, self.preload).add_done_callback(_ignore)

    def shutdown(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)

    async def run(self, fn, *args: Any) -> Any:
        """``fn(*args)`` in a render process; 503 when the render queue is full, RenderMemoryExceeded past the
        memory cap."""
        if self.in_flight >= self.capacity:
            raise SolverBusy(self.retry_after_s, queue="render")
        self.in_flight += 1
        try:
            for _ in range(3):  # a job lost only because another job's process was killed is run again
                self._jobs += 1
                job = self._jobs
                executor = self._pool()
                if self.memory_cap_bytes and (self._watcher is None or self._watcher.done()):
                    self._watcher = asyncio.ensure_future(self._watch())
                try:
                    return await asyncio.get_running_loop().run_in_executor(executor, _tracked, job, fn, args)
                except BrokenProcessPool:
                    if self._executor is executor:
                        self._executor = None
                    if job in self._killed:
                        raise RenderMemoryExceeded(self.memory_cap_bytes // 2**20, self._killed[job]) from None
                    if id(executor) not in self._killed_pools:
                        raise SolverFailed("a render process died (out of memory?); retry") from None
            raise SolverFailed("render processes kept being killed for memory; retry")
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._killed.clear()
                self._killed_pools.clear()
                self._retire_if_holding(self._executor)

    @staticmethod
    def _rss(pid: int) -> int:
        from service.solving import rss_bytes  # here, not at the top: a render process loads none of solving

        return rss_bytes(pid) or 0

    @staticmethod
    def _pids(executor: ProcessPoolExecutor | None) -> list[int]:
        # concurrent.futures keeps its processes by pid; it offers no public way to see them
        return list(getattr(executor, "_processes", None) or ())

    def process_ids(self) -> list[int]:
        """The render processes running now (started ahead of need, or by jobs)."""
        return self._pids(self._executor)

    async def _watch(self) -> None:
        """Kill a render process passing the cap, while any job runs (its jobs then fail: see :meth:`run`)."""
        while self.in_flight > 0:
            for pid in self._pids(self._executor):
                rss = self._rss(pid)
                self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
                if rss > self.memory_cap_bytes:
                    running = self._running
                    slots = range(0, len(running), 2) if running is not None else ()
                    job = next((running[k + 1] for k in slots if running[k] == pid), -1)
                    self._killed[job] = rss
                    self._killed_pools.add(id(self._executor))
                    _kill(pid)
            await asyncio.sleep(_WATCH_S)

    def _retire_if_holding(self, executor: ProcessPoolExecutor | None) -> None:
        """Let the pool go (a new one is made for the next job) when a process holds more than the idle cap."""
        if not self.idle_memory_bytes or executor is None:
            return
        if any(self._rss(pid) > self.idle_memory_bytes for pid in self._pids(executor)):
            self._executor = None
            executor.shutdown(wait=False)
            if self.prestart:
                self.warm()

    async def chart(self, key: tuple, fn, *args: Any) -> bytes:
        """The PNG ``fn(*args)`` draws, from the cache when ``key`` (the rows it shows) was drawn before."""
        png = self._charts.get(key)
        if png is not None:
            self._charts.move_to_end(key)
            return png
        png = await self.run(fn, *args)
        if self.cache_entries > 0:
            self._charts[key] = png
            while len(self._charts) > self.cache_entries:
                self._charts.popitem(last=False)
        return png


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:  # it ended on its own meanwhile
        pass


# --- run in the render processes -----------------------------------------------------------------


_slot: tuple[Any, int] | None = None  # this process's (pid, job id) slot in the pool's shared array


def _set_up(service_pid: int, running: Any, started: Any, nice: int = 0) -> None:
    global _slot
    # A Ctrl-C reaches the whole process group: the service stops its render processes itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if nice > 0:
        os.nice(nice)
    with started.get_lock():  # processes replaced after their jobs take the slots in turn
        k = started.value % (len(running) // 2)
        started.value += 1
    _slot = (running, 2 * k)
    running[2 * k] = os.getpid()
    from service.solving.lifeline import die_with_parent

    die_with_parent(service_pid)  # a killed service leaves no render process behind


def _preload(modules: tuple[str, ...]) -> None:
    for name in modules:
        importlib.import_module(name)


def _ignore(future: Any) -> None:
    if not future.cancelled():
        future.exception()  # a warm-up that failed (the pool shut down meanwhile) is not worth a log line


def _tracked(job: int, fn, args: tuple) -> Any:
    """``fn(*args)``, this process's slot saying it runs ``job`` meanwhile."""
    if _slot is not None:
        running, k = _slot
        running[k], running[k + 1] = os.getpid(), job
    return fn(*args)


def _stale(stats_id: Any, exc: Exception) -> dict[str, Any]:
    return {"stale": str(exc), "errors": getattr(exc, "errors", None), "stats_id": stats_id}


def raise_if_stale(result: Any) -> Any:
    """A render's answer; StoredStatsInvalid (409) when the stored stats failed this planner's validation."""
    if isinstance(result, dict) and "stale" in result:
        raise StoredStatsInvalid(result["stats_id"], result["stale"], errors=result["errors"])
    return result


def plan_chart_job(stats_id: Any, document: str, plan: str) -> bytes | dict[str, Any]:
    import planner
    from service.views.charts import plan_chart

    try:
        stats = planner.parse_stats(json.loads(document))
    except planner.StatsError as exc:
        return _stale(stats_id, exc)
    return plan_chart(stats, json.loads(plan))


def sweep_chart_job(model_name: str, plans: list[str], baseline_peak_bytes: int,
                    without_offload: list[str] = ()) -> bytes:
    from service.views.charts import sweep_chart

    return sweep_chart(model_name, [json.loads(p) for p in plans], baseline_peak_bytes,
                       without_offload=[json.loads(p) for p in without_offload])


def pipeline_chart_job(model_name: str, pipeline_json: str) -> bytes:
    from service.views.charts import pipeline_chart

    return pipeline_chart(model_name, json.loads(pipeline_json))


def stats_detail_job(stats_id: Any, document: str, summary_json: str) -> bytes | dict[str, Any]:
    """The StatsDetail JSON of an upload: its summary (``StatsSummary`` JSON) and its module tree."""
    import planner
    from service.views.bodies import module_tree_json

    try:
        stats = planner.parse_stats(json.loads(document))
    except planner.StatsError as exc:
        return _stale(stats_id, exc)
    # The tree is written by hand, without recursion (any depth the format allows); the summary by its model.
    return f'{summary_json[:-1]},"module_tree":{module_tree_json(stats)}}}'.encode()

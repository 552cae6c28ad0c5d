"""The solver pool: shutdown, hard deadlines, the memory cap, recycling and per-project shares."""

from __future__ import annotations

import asyncio
import time

import pytest
from solver_jobs import grow, pid

from service.errors import ProjectBusy, SolverFailed
from service.solving import SolverPool, SolverStopped

MIB = 2**20


def test_shutdown_joins_the_workers():
    pool = SolverPool(workers=2, queue_size=0)
    pool.start()
    processes = [w.process for w in pool._all]
    assert len(processes) == 2
    # A grace far past a worker's start (spawn + numpy/scipy imports: over 5 s on a loaded 2-core machine,
    # when the default grace killed them, exit code -9): this test is about joining, not about the grace.
    pool.shutdown(grace_s=120)
    assert not any(p.is_alive() for p in processes)  # joined, not left to the interpreter's exit
    assert all(p.exitcode == 0 for p in processes)  # idle ones left by themselves
    pool.shutdown()  # twice is harmless


def test_shutdown_kills_a_solve_past_its_grace():
    pool = SolverPool(workers=1, queue_size=0)

    async def run():
        await pool.run(time.sleep, 0.0)  # the worker is up and idle: the next job starts at once
        processes = [w.process for w in pool._all]
        job = asyncio.ensure_future(pool.run(time.sleep, 60.0))  # a solve that would outlive the grace
        while pool.in_flight == 0:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        pool.shutdown(grace_s=0.5)
        with pytest.raises(SolverFailed):  # killed, not waited for: time.sleep would have returned None
            await job
        return processes

    processes = asyncio.run(run())
    assert not any(p.is_alive() for p in processes)


def test_a_job_past_its_deadline_and_grace_is_stopped_and_its_process_replaced():
    pool = SolverPool(workers=1, queue_size=0, grace_s=0.2)

    async def run():
        first = await pool.run(pid)
        with pytest.raises(SolverStopped) as stopped:
            await pool.run(time.sleep, 60.0, deadline=time.monotonic() + 0.3)
        return first, stopped.value, await pool.run(pid)

    try:
        first, stopped, after = asyncio.run(run())
    finally:
        pool.shutdown()
    assert stopped.reason == "time_limit"
    assert after != first  # the stopped process was killed; a new one ran the next job


def test_a_job_past_the_memory_cap_is_stopped():
    pool = SolverPool(workers=1, queue_size=0, memory_cap_bytes=400 * MIB)

    async def run():
        with pytest.raises(SolverStopped) as stopped:
            await pool.run(grow, 800, 30.0)  # holds 800 MiB for 30 s unless stopped
        return stopped.value

    try:
        stopped = asyncio.run(run())
    finally:
        pool.shutdown()
    assert stopped.reason == "memory"
    assert "400 MiB" in stopped.message


def test_a_process_holding_memory_after_a_job_is_replaced():
    pool = SolverPool(workers=1, queue_size=0, idle_memory_bytes=300 * MIB)

    async def run():
        small = await pool.run(grow, 1)  # well under: the same process goes on
        same = await pool.run(pid)
        big = await pool.run(grow, 500)  # the process keeps 500 MiB: replaced after the job
        return small, same, big, await pool.run(pid)

    try:
        small, same, big, after = asyncio.run(run())
    finally:
        pool.shutdown()
    assert small == same == big
    assert after != big


def test_a_project_over_its_share_waits_and_others_do_not():
    pool = SolverPool(workers=1, queue_size=4, retry_after_s=3, per_project=1)

    async def run():
        held = asyncio.ensure_future(pool.run(time.sleep, 1.0, project="a"))
        while pool.in_flight == 0:
            await asyncio.sleep(0.01)
        with pytest.raises(ProjectBusy) as busy:
            await pool.run(pid, project="a")
        other = await pool.run(pid, project="b")  # queued behind a's job, then run
        await held
        return busy.value, other

    try:
        busy, other = asyncio.run(run())
    finally:
        pool.shutdown()
    assert busy.status_code == 429 and busy.headers == {"Retry-After": "3"}
    assert "'a'" in busy.message
    assert isinstance(other, int)

"""The solver pool's shutdown: workers joined and released, a stuck solve killed after its grace."""

from __future__ import annotations

import asyncio
import time

import pytest

from service.errors import SolverFailed
from service.solver import SolverPool


def test_shutdown_joins_the_workers():
    pool = SolverPool(workers=2, queue_size=0)
    pool.start()
    processes = list(pool._executor._processes.values())
    assert len(processes) == 2
    # A grace far past a worker's start (spawn + numpy/scipy imports: over 5 s on a loaded 2-core machine,
    # when the default grace killed them, exit code -9): this test is about joining, not about the grace.
    pool.shutdown(grace_s=120)
    assert not any(p.is_alive() for p in processes)  # joined, not left to the interpreter's exit
    assert all(p.exitcode == 0 for p in processes)
    pool.shutdown()  # twice is harmless


def test_shutdown_kills_a_solve_past_its_grace():
    pool = SolverPool(workers=1, queue_size=0)

    async def run():
        await pool.run(time.sleep, 0.0)  # the worker is up and idle: the next job starts at once
        processes = list(pool._executor._processes.values())
        job = asyncio.ensure_future(pool.run(time.sleep, 60.0))  # a solve that would outlive the grace
        while pool.in_flight == 0:
            await asyncio.sleep(0.01)
        pool.shutdown(grace_s=0.5)
        with pytest.raises(SolverFailed):  # killed, not waited for: time.sleep would have returned None
            await job
        return processes

    processes = asyncio.run(run())
    assert not any(p.is_alive() for p in processes)

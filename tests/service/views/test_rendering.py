"""Renders in bounded processes: a full render queue is 503, and a chart drawn before needs no render."""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import check_png

from service.errors import SolverBusy
from service.views import Renderer, sweep_chart_job

PLAN = json.dumps({"status": "optimal", "memory_budget_gib": 4.0, "recompute_ms": 2.0})


def test_a_cached_chart_is_served_when_the_render_queue_is_full():
    renderer = Renderer(workers=1, queue_size=0, retry_after_s=2, cache_entries=4)

    async def run():
        first = await renderer.chart(("sweep", 1, "t"), sweep_chart_job, "m", [PLAN], 2**33)
        renderer.in_flight = renderer.capacity  # every render slot taken from here on
        again = await renderer.chart(("sweep", 1, "t"), sweep_chart_job, "m", [PLAN], 2**33)
        with pytest.raises(SolverBusy):  # anything not drawn before needs a slot
            await renderer.chart(("sweep", 2, "t"), sweep_chart_job, "m", [PLAN], 2**33)
        return first, again

    try:
        first, again = asyncio.run(run())
    finally:
        renderer.in_flight = 0
        renderer.shutdown()
    check_png(first)
    assert again == first

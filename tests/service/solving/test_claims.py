"""The solve claim in the database: taken once, shared when answered, taken over when its owner died."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta

import pytest

from service.solving import solve_once
from service.store import SolveClaim, make_engine, make_sessionmaker, utcnow


@pytest.fixture
def factory(settings):
    engine = make_engine(settings.sqlalchemy_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def _hold(factory, key: str, *, expires_in_s: float, outcome: str | None = None) -> None:
    """A claim as another process (``owner`` 'elsewhere') would leave it."""
    with factory() as session:
        session.add(SolveClaim(key=key, project="p", owner="elsewhere", outcome=outcome,
                               expires_at=utcnow() + timedelta(seconds=expires_in_s)))
        session.commit()


def _solver(calls: list[int], answer: dict):
    async def solve() -> dict:
        calls.append(1)
        return answer

    return solve


def test_the_first_request_solves_and_leaves_its_answer_for_the_next(factory):
    calls: list[int] = []
    first = asyncio.run(solve_once(factory, "k", "p", _solver(calls, {"x": 1}), wait_s=5))
    again = asyncio.run(solve_once(factory, "k", "p", _solver(calls, {"x": 2}), wait_s=5))
    assert first == ({"x": 1}, False)
    assert again == ({"x": 1}, True)  # the answer written under the claim, no second solve
    assert len(calls) == 1


def test_a_lapsed_claim_of_a_dead_process_is_taken_over(factory):
    _hold(factory, "k", expires_in_s=-1.0)
    calls: list[int] = []
    assert asyncio.run(solve_once(factory, "k", "p", _solver(calls, {"x": 3}), wait_s=5)) == ({"x": 3}, False)
    assert calls == [1]


def test_a_waiter_gets_the_answer_the_owner_writes_later(factory):
    _hold(factory, "k", expires_in_s=30.0)

    def owner_answers() -> None:
        time.sleep(0.3)
        with factory() as session:
            session.get(SolveClaim, "k").outcome = '{"x": 4}'
            session.commit()

    writer = threading.Thread(target=owner_answers)
    writer.start()
    calls: list[int] = []
    got = asyncio.run(solve_once(factory, "k", "p", _solver(calls, {"x": 5}), wait_s=10))
    writer.join()
    assert got == ({"x": 4}, True) and calls == []


def test_a_waiter_takes_over_when_the_owner_stops_refreshing(factory):
    _hold(factory, "k", expires_in_s=0.4)  # its owner died: nobody moves the expiry on
    calls: list[int] = []
    got = asyncio.run(solve_once(factory, "k", "p", _solver(calls, {"x": 6}), wait_s=10))
    assert got == ({"x": 6}, False) and calls == [1]


def test_a_failed_solve_drops_its_claim(factory):
    async def fails() -> dict:
        raise RuntimeError("queue full")

    with pytest.raises(RuntimeError):
        asyncio.run(solve_once(factory, "k", "p", fails, wait_s=5))
    with factory() as session:
        assert session.get(SolveClaim, "k") is None


def test_a_project_holding_its_share_of_live_claims_anywhere_gets_429(factory):
    from service.errors import ProjectBusy

    _hold(factory, "other-solve", expires_in_s=30.0)  # project p's solve under way in another process
    calls: list[int] = []
    with pytest.raises(ProjectBusy) as busy:
        asyncio.run(solve_once(factory, "k", "p", _solver(calls, {"x": 7}), wait_s=5, share=(1, 3)))
    assert busy.value.status_code == 429 and busy.value.headers == {"Retry-After": "3"} and calls == []
    # another project is not held back, nor is p with a larger share
    assert asyncio.run(solve_once(factory, "k", "q", _solver(calls, {"x": 8}), wait_s=5, share=(1, 3)))[0] == {"x": 8}
    assert asyncio.run(solve_once(factory, "k2", "p", _solver(calls, {"x": 9}), wait_s=5, share=(2, 3)))[0] == {"x": 9}

"""insert_or_get: how a row is stored when a concurrent writer may store the same unique key first."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.exc import NoResultFound
from sqlalchemy.orm import Session

from service.store import PlanRecord, StatsRecord, insert_or_get, make_engine, new_id


@pytest.fixture
def engine(settings):
    engine = make_engine(settings.sqlalchemy_url)
    yield engine
    engine.dispose()


def _stats(content_hash: str) -> StatsRecord:
    return StatsRecord(project="default", content_hash=content_hash, model_name="m", source_format="v1",
                       module_count=1, op_count=0, baseline_peak_bytes=1, compute_ms=1.0, document="{}")


def _same_hash(content_hash: str):
    return select(StatsRecord).where(StatsRecord.project == "default", StatsRecord.content_hash == content_hash)


def test_a_new_row_is_inserted(engine):
    with Session(engine) as session:
        row = _stats("a")
        assert insert_or_get(session, row, _same_hash("a")) == (row, True)
        session.commit()
        assert row.id is not None


def test_the_row_another_writer_stored_first_is_returned_and_the_session_stays_usable(engine):
    with Session(engine) as other:
        first = _stats("a")
        other.add(first)
        other.commit()
        first_id = first.id
    with Session(engine) as session:
        stored, inserted = insert_or_get(session, _stats("a"), _same_hash("a"))
        assert (stored.id, inserted) == (first_id, False)
        assert insert_or_get(session, _stats("b"), _same_hash("b"))[1]  # the savepoint rolled back only the loser
        session.commit()
        assert session.execute(select(StatsRecord.content_hash).order_by(StatsRecord.content_hash)).scalars().all() == ["a", "b"]


def test_another_failure_finds_nothing_and_raises_no_result_found(engine):
    """A plan of stats that are gone (deleted meanwhile) fails its foreign key, not its unique key."""
    plan = PlanRecord(stats_id=new_id(), cache_key="k", planner_version="0", request={}, memory_budget_gib=1.0,
                      world_size=1, status="optimal", solve_seconds=0.0, result="{}")
    with Session(engine) as session, pytest.raises(NoResultFound):
        insert_or_get(session, plan, select(PlanRecord).where(PlanRecord.cache_key == "k"))


def test_rows_inserted_in_one_session_become_visible_together_at_its_commit(engine):
    # A sweep's plans are stored in one session: a reader seeing some of them solved the rest again (a second
    # solve in test_one_solve's sweeps-two-replicas). pysqlite ran each savepoint outside any transaction, so
    # its RELEASE committed that row alone.
    with Session(engine) as session, engine.connect() as reader:
        def visible() -> list[str]:
            return reader.execute(select(StatsRecord.content_hash).order_by(StatsRecord.content_hash)).scalars().all()

        assert insert_or_get(session, _stats("a"), _same_hash("a"))[1]
        assert insert_or_get(session, _stats("b"), _same_hash("b"))[1]
        assert visible() == []
        reader.rollback()  # end the reader's snapshot
        session.commit()
        assert visible() == ["a", "b"]

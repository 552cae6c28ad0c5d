"""opaque ids: stats, plans and sweeps named by random UUIDs instead of one global sequence

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24 11:50:00

Every row keeps its data; only its id changes, and every reference with it
(tags', plans' and sweeps' ``stats_id``, sweeps' ``plan_ids`` lists). The tables
are rebuilt rather than altered in place, the same way on SQLite and
PostgreSQL: the old ones are renamed aside, the new ones created as the models
declare them, rows copied across in SQL through an old-id -> new-id table (a
stats document never passes through Python), then the old tables dropped,
children first (on SQLite dropping a parent first would cascade-delete them).

Downgrade does the reverse: ids 1, 2, ... in creation order.
"""
from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Sequence

import sqlalchemy as sa
from alembic import context, op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

ID_LENGTH = 36  # service.ids: a UUID in canonical form
OWN_IDS = ("stats", "plans", "sweeps")  # tables whose rows are named by an id; stats_tags hangs off stats
INDEXES = {"stats": ["ix_stats_model_name", "ix_stats_project"], "stats_tags": ["ix_stats_tags_key_value"],
           "plans": ["ix_plans_stats_id"], "sweeps": ["ix_sweeps_stats_id"]}
# Constraints that own an index: on PostgreSQL their names are schema-wide, so the old ones step aside.
INDEXED_CONSTRAINTS = {"stats": ["pk_stats", "uq_stats_project_content_hash"], "stats_tags": ["pk_stats_tags"],
                       "plans": ["pk_plans", "uq_plans_stats_id_cache_key"],
                       "sweeps": ["pk_sweeps", "uq_sweeps_stats_id_cache_key"]}
CHILDREN_FIRST = ("sweeps", "plans", "stats_tags", "stats")


def _create_tables(id_type: Callable[[], sa.types.TypeEngine]) -> None:
    """The schema of revision 0001, with ids (and references to them) of ``id_type``."""
    op.create_table('stats',
    sa.Column('id', id_type(), nullable=False),
    sa.Column('project', sa.String(length=128), nullable=False),
    sa.Column('content_hash', sa.String(length=64), nullable=False),
    sa.Column('model_name', sa.String(length=256), nullable=False),
    sa.Column('source_format', sa.String(length=16), nullable=False),
    sa.Column('module_count', sa.Integer(), nullable=False),
    sa.Column('op_count', sa.Integer(), nullable=False),
    sa.Column('baseline_peak_bytes', sa.BigInteger(), nullable=False),
    sa.Column('compute_ms', sa.Float(), nullable=False),
    sa.Column('document', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_stats')),
    sa.UniqueConstraint('project', 'content_hash', name=op.f('uq_stats_project_content_hash'))
    )
    op.create_index(op.f('ix_stats_model_name'), 'stats', ['model_name'], unique=False)
    op.create_index(op.f('ix_stats_project'), 'stats', ['project'], unique=False)

    op.create_table('plans',
    sa.Column('id', id_type(), nullable=False),
    sa.Column('stats_id', id_type(), nullable=False),
    sa.Column('cache_key', sa.String(length=64), nullable=False),
    sa.Column('planner_version', sa.String(length=32), nullable=False),
    sa.Column('request', sa.JSON(), nullable=False),
    sa.Column('memory_budget_gib', sa.Float(), nullable=False),
    sa.Column('world_size', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('peak_bytes', sa.BigInteger(), nullable=True),
    sa.Column('recompute_ms', sa.Float(), nullable=True),
    sa.Column('solve_seconds', sa.Float(), nullable=False),
    sa.Column('result', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['stats_id'], ['stats.id'], name=op.f('fk_plans_stats_id_stats'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_plans')),
    sa.UniqueConstraint('stats_id', 'cache_key', name=op.f('uq_plans_stats_id_cache_key'))
    )
    op.create_index(op.f('ix_plans_stats_id'), 'plans', ['stats_id'], unique=False)

    op.create_table('stats_tags',
    sa.Column('stats_id', id_type(), nullable=False),
    sa.Column('key', sa.String(length=128), nullable=False),
    sa.Column('value', sa.String(length=1024), nullable=False),
    sa.ForeignKeyConstraint(['stats_id'], ['stats.id'], name=op.f('fk_stats_tags_stats_id_stats'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('stats_id', 'key', name=op.f('pk_stats_tags'))
    )
    op.create_index('ix_stats_tags_key_value', 'stats_tags', ['key', 'value'], unique=False)

    op.create_table('sweeps',
    sa.Column('id', id_type(), nullable=False),
    sa.Column('stats_id', id_type(), nullable=False),
    sa.Column('cache_key', sa.String(length=64), nullable=False),
    sa.Column('request', sa.JSON(), nullable=False),
    sa.Column('plan_ids', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['stats_id'], ['stats.id'], name=op.f('fk_sweeps_stats_id_stats'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_sweeps')),
    sa.UniqueConstraint('stats_id', 'cache_key', name=op.f('uq_sweeps_stats_id_cache_key'))
    )
    op.create_index(op.f('ix_sweeps_stats_id'), 'sweeps', ['stats_id'], unique=False)


def _set_aside(postgresql: bool) -> None:
    """Rename the current tables to ``<name>_old``, their index names out of the new tables' way."""
    for table in CHILDREN_FIRST:
        for index in INDEXES[table]:
            op.drop_index(index, table_name=table)
        if postgresql:
            for name in INDEXED_CONSTRAINTS[table]:
                op.execute(f'ALTER TABLE {table} RENAME CONSTRAINT {name} TO {name}_old')
        op.rename_table(table, f"{table}_old")


def _copy_rows(conn: sa.Connection, old_type: sa.types.TypeEngine, new_type: sa.types.TypeEngine,
               new_ids: Callable[[Sequence], list]) -> dict[str, dict]:
    """Copy every row into the new tables under new ids; returns old id -> new id per table."""
    maps: dict[str, dict] = {}
    for table in OWN_IDS:
        old = conn.execute(sa.text(f"SELECT id FROM {table}_old ORDER BY created_at, id")).scalars().all()
        maps[table] = dict(zip(old, new_ids(old)))
        id_map = sa.Table(f"idmap_{table}", sa.MetaData(), sa.Column("old_id", old_type, primary_key=True),
                          sa.Column("new_id", new_type, nullable=False))
        id_map.create(conn)
        if old:
            conn.execute(id_map.insert(), [{"old_id": o, "new_id": n} for o, n in maps[table].items()])
    stats_cols = ("project, content_hash, model_name, source_format, module_count, op_count, "
                  "baseline_peak_bytes, compute_ms, document, created_at")
    plan_cols = ("cache_key, planner_version, request, memory_budget_gib, world_size, status, peak_bytes, "
                 "recompute_ms, solve_seconds, result, created_at")
    sweep_cols = "cache_key, request, plan_ids, created_at"
    statements = [
        f"INSERT INTO stats (id, {stats_cols}) SELECT m.new_id, {_prefixed('o', stats_cols)} "
        f"FROM stats_old o JOIN idmap_stats m ON m.old_id = o.id",
        "INSERT INTO stats_tags (stats_id, key, value) SELECT m.new_id, o.key, o.value "
        "FROM stats_tags_old o JOIN idmap_stats m ON m.old_id = o.stats_id",
        f"INSERT INTO plans (id, stats_id, {plan_cols}) SELECT m.new_id, s.new_id, {_prefixed('o', plan_cols)} "
        f"FROM plans_old o JOIN idmap_plans m ON m.old_id = o.id JOIN idmap_stats s ON s.old_id = o.stats_id",
        f"INSERT INTO sweeps (id, stats_id, {sweep_cols}) SELECT m.new_id, s.new_id, {_prefixed('o', sweep_cols)} "
        f"FROM sweeps_old o JOIN idmap_sweeps m ON m.old_id = o.id JOIN idmap_stats s ON s.old_id = o.stats_id",
    ]
    for statement in statements:
        conn.execute(sa.text(statement))
    return maps


def _prefixed(alias: str, columns: str) -> str:
    return ", ".join(f"{alias}.{c.strip()}" for c in columns.split(","))


def _check_references(conn: sa.Connection) -> None:
    """Refuse, before changing anything, a database whose references point nowhere (SQLite runs DDL outside
    the migration's transaction, so a failure halfway could not be rolled back there)."""
    for table in ("stats_tags", "plans", "sweeps"):
        orphans = conn.execute(sa.text(f"SELECT count(*) FROM {table} t WHERE NOT EXISTS "
                                       f"(SELECT 1 FROM stats s WHERE s.id = t.stats_id)")).scalar_one()
        if orphans:
            raise RuntimeError(f"table {table} has {orphans} rows whose stats_id names no stats row: the database "
                               f"is inconsistent; nothing was changed")
    plan_ids = set(conn.execute(sa.text("SELECT id FROM plans")).scalars())
    sweeps = sa.table("sweeps", sa.column("id"), sa.column("plan_ids", sa.JSON()))
    for sweep_id, listed in conn.execute(sa.select(sweeps.c.id, sweeps.c.plan_ids)):
        missing = [p for p in listed if p not in plan_ids]
        if missing:
            raise RuntimeError(f"sweep {sweep_id} lists plan ids {missing} that no plan has: the database is "
                               f"inconsistent; nothing was changed")


def _sweep_key(plan_ids: list) -> str:
    """A sweep's cache key: SHA-256 of its plan ids joined by commas (as the service keys sweeps)."""
    return hashlib.sha256(",".join(str(i) for i in plan_ids).encode()).hexdigest()


def _rename_sweep_plan_ids(conn: sa.Connection, new_type: sa.types.TypeEngine, plan_map: dict) -> None:
    """Each sweep's list of plan ids in the new ids, and its cache key (made of them) anew.

    JSON is read and written through SQLAlchemy's JSON type, the same on both databases.
    """
    sweeps = sa.table("sweeps", sa.column("id", new_type), sa.column("plan_ids", sa.JSON()),
                      sa.column("cache_key", sa.String()))
    updates = []
    for sweep_id, plan_ids in conn.execute(sa.select(sweeps.c.id, sweeps.c.plan_ids)):
        renamed = [plan_map[p] for p in plan_ids]
        updates.append({"b_id": sweep_id, "b_plan_ids": renamed, "b_key": _sweep_key(renamed)})
    if updates:
        conn.execute(sweeps.update().where(sweeps.c.id == sa.bindparam("b_id"))
                     .values(plan_ids=sa.bindparam("b_plan_ids"), cache_key=sa.bindparam("b_key")), updates)


def _convert(old_type: Callable[[], sa.types.TypeEngine], new_type: Callable[[], sa.types.TypeEngine],
             new_ids: Callable[[Sequence], list]) -> None:
    if context.is_offline_mode():
        raise RuntimeError("revision 0002 rewrites the rows' ids and needs the database itself: it cannot be "
                           "rendered as SQL (--sql); run 'sacplan db upgrade' against the database")
    conn = op.get_bind()
    postgresql = conn.dialect.name == "postgresql"
    _check_references(conn)
    _set_aside(postgresql)
    _create_tables(new_type)
    maps = _copy_rows(conn, old_type(), new_type(), new_ids)
    _rename_sweep_plan_ids(conn, new_type(), maps["plans"])
    for table in CHILDREN_FIRST:
        op.drop_table(f"{table}_old")
    for table in OWN_IDS:
        op.drop_table(f"idmap_{table}")
    if postgresql and isinstance(new_type(), sa.Integer):  # the serial counters continue after the copied ids
        for table in OWN_IDS:
            op.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                       f"GREATEST((SELECT max(id) FROM {table}), 1))")


def upgrade() -> None:
    _convert(sa.Integer, lambda: sa.String(length=ID_LENGTH), lambda old: [str(uuid.uuid4()) for _ in old])


def downgrade() -> None:
    _convert(lambda: sa.String(length=ID_LENGTH), sa.Integer, lambda old: list(range(1, len(old) + 1)))

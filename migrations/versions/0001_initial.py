"""initial schema: stats, tags, plans, sweeps

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-22 04:23:15.459994
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('stats',
    sa.Column('id', sa.Integer(), nullable=False),
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
    with op.batch_alter_table('stats', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_stats_model_name'), ['model_name'], unique=False)
        batch_op.create_index(batch_op.f('ix_stats_project'), ['project'], unique=False)

    op.create_table('plans',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('stats_id', sa.Integer(), nullable=False),
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
    with op.batch_alter_table('plans', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_plans_stats_id'), ['stats_id'], unique=False)

    op.create_table('stats_tags',
    sa.Column('stats_id', sa.Integer(), nullable=False),
    sa.Column('key', sa.String(length=128), nullable=False),
    sa.Column('value', sa.String(length=1024), nullable=False),
    sa.ForeignKeyConstraint(['stats_id'], ['stats.id'], name=op.f('fk_stats_tags_stats_id_stats'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('stats_id', 'key', name=op.f('pk_stats_tags'))
    )
    with op.batch_alter_table('stats_tags', schema=None) as batch_op:
        batch_op.create_index('ix_stats_tags_key_value', ['key', 'value'], unique=False)

    op.create_table('sweeps',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('stats_id', sa.Integer(), nullable=False),
    sa.Column('cache_key', sa.String(length=64), nullable=False),
    sa.Column('request', sa.JSON(), nullable=False),
    sa.Column('plan_ids', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['stats_id'], ['stats.id'], name=op.f('fk_sweeps_stats_id_stats'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_sweeps')),
    sa.UniqueConstraint('stats_id', 'cache_key', name=op.f('uq_sweeps_stats_id_cache_key'))
    )
    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_sweeps_stats_id'), ['stats_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_sweeps_stats_id'))

    op.drop_table('sweeps')
    with op.batch_alter_table('stats_tags', schema=None) as batch_op:
        batch_op.drop_index('ix_stats_tags_key_value')

    op.drop_table('stats_tags')
    with op.batch_alter_table('plans', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_plans_stats_id'))

    op.drop_table('plans')
    with op.batch_alter_table('stats', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_stats_project'))
        batch_op.drop_index(batch_op.f('ix_stats_model_name'))

    op.drop_table('stats')

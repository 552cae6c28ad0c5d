"""pipeline plans: every stage of a pipeline planned under one budget, naming one cached plan per stage

Revision ID: 0005
Revises: 0004

A new table only: nothing existing is converted.
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('pipeline_plans',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('project', sa.String(length=128), nullable=False),
    sa.Column('cache_key', sa.String(length=64), nullable=False),
    sa.Column('request', sa.JSON(), nullable=False),
    sa.Column('stats_ids', sa.JSON(), nullable=False),
    sa.Column('plan_ids', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_pipeline_plans')),
    sa.UniqueConstraint('project', 'cache_key', name=op.f('uq_pipeline_plans_project_cache_key'))
    )
    op.create_index(op.f('ix_pipeline_plans_project'), 'pipeline_plans', ['project'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_pipeline_plans_project'), table_name='pipeline_plans')
    op.drop_table('pipeline_plans')

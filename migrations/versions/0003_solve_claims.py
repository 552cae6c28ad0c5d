"""solve claims: one solve per set of plan keys across worker processes and replicas

Revision ID: 0003
Revises: 0002

The table names no stats, plan or sweep row: its key is the solve's hash of plan
cache keys, so it has no foreign keys and nothing to convert for 0002's UUID ids.
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('solve_claims',
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('project', sa.String(length=128), nullable=False),
    sa.Column('owner', sa.String(length=64), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('outcome', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('key', name=op.f('pk_solve_claims'))
    )


def downgrade() -> None:
    op.drop_table('solve_claims')

"""auth failures: the failed-authentication throttle shared by worker processes and replicas

Revision ID: 0004
Revises: 0003

A new table only: nothing existing is converted.
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('auth_failures',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('address', sa.String(length=64), nullable=False),
    sa.Column('failed_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_auth_failures'))
    )
    op.create_index('ix_auth_failures_address_failed_at', 'auth_failures', ['address', 'failed_at'], unique=False)
    op.create_index(op.f('ix_auth_failures_failed_at'), 'auth_failures', ['failed_at'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_auth_failures_failed_at'), table_name='auth_failures')
    op.drop_index('ix_auth_failures_address_failed_at', table_name='auth_failures')
    op.drop_table('auth_failures')

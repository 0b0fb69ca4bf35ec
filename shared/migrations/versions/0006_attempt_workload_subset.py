"""attempts: the workloads an attempt runs when not all of them (a rung of the tuner's halving)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03 10:00:00
"""

import sqlalchemy as sa
from alembic import op


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('workload_uuids', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_column('workload_uuids')

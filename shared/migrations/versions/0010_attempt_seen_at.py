"""attempts.seen_at: the last sign that an attempt in flight is looked after (its evaluator's
heartbeat while RUNNING; the planner's sweep sending it again while PENDING) (issue 40, H3)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07 20:10:00
"""

import sqlalchemy as sa
from alembic import op


revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('seen_at', sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_column('seen_at')

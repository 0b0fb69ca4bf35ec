"""attempts: which evaluator holds a RUNNING attempt, since when, and how many times one started it

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03 07:10:00
"""

import sqlalchemy as sa
from alembic import op


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('evaluator', sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column('started_at', sa.DateTime(), nullable=True))
        batch_op.add_column(sa.Column('tries', sa.Integer(), server_default='0', nullable=False))
        batch_op.create_index('ix_attempts_status_evaluator', ['status', 'evaluator'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_index('ix_attempts_status_evaluator')
        batch_op.drop_column('tries')
        batch_op.drop_column('started_at')
        batch_op.drop_column('evaluator')

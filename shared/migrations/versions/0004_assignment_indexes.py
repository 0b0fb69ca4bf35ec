"""assignment indexes (the planner's per-tick queries)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 16:30:00
"""

from alembic import op


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('assignments', schema=None) as batch_op:
        batch_op.create_index('ix_assignments_campaign_status', ['campaign_id', 'status'], unique=False)
        batch_op.create_index('ix_assignments_campaign_problem', ['campaign_id', 'problem_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('assignments', schema=None) as batch_op:
        batch_op.drop_index('ix_assignments_campaign_problem')
        batch_op.drop_index('ix_assignments_campaign_status')

"""attempt indexes

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 11:52:08.062961
"""

from alembic import op


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.create_index('ix_attempts_campaign_problem', ['campaign_id', 'problem_id'], unique=False)
        batch_op.create_index('ix_attempts_problem_status', ['problem_id', 'status'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_index('ix_attempts_problem_status')
        batch_op.drop_index('ix_attempts_campaign_problem')


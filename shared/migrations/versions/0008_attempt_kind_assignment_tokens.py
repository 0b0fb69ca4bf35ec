"""attempts.kind (evaluate, profile, inspect: the writer's diagnostic tools are attempts too) and
attempts.tool_args (JSON: what the tool was asked, e.g. the kernel to disassemble) and
assignments.tokens (an LLM session's tokens that no attempt carries) (issue 27); assignments.writer
(tuner or llm:<model>: what an exhausted search was exhausted for), campaigns.continuous and
campaigns.status_reason (why it stopped, or why a running one is idle) (issue 28)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-07 01:20:00
"""

import sqlalchemy as sa
from alembic import op


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('kind', sa.String(length=16), nullable=False, server_default='evaluate'))
        batch_op.add_column(sa.Column('tool_args', sa.Text(), nullable=True))
    with op.batch_alter_table('assignments', schema=None) as batch_op:
        batch_op.add_column(sa.Column('tokens', sa.Integer(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('writer', sa.String(length=255), nullable=True))
    with op.batch_alter_table('campaigns', schema=None) as batch_op:
        batch_op.add_column(sa.Column('continuous', sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.add_column(sa.Column('status_reason', sa.String(length=255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('campaigns', schema=None) as batch_op:
        batch_op.drop_column('status_reason')
        batch_op.drop_column('continuous')
    with op.batch_alter_table('assignments', schema=None) as batch_op:
        batch_op.drop_column('writer')
        batch_op.drop_column('tokens')
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_column('tool_args')
        batch_op.drop_column('kind')

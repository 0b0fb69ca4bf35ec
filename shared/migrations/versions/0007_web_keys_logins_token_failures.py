"""web: the stored session key, logged-in sessions and failed submit tokens (issue 25)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05 08:40:00
"""

import sqlalchemy as sa
from alembic import op


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'web_keys',
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('value', sa.Text(), nullable=False),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint('name'),
    )
    op.create_table(
        'web_logins',
        sa.Column('id_hash', sa.String(length=64), nullable=False),
        sa.Column('token_tag', sa.String(length=64), nullable=False),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.Column('expires_at', sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint('id_hash'),
    )
    op.create_index('ix_web_logins_expires_at', 'web_logins', ['expires_at'], unique=False)
    op.create_table(
        'token_failures',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('client', sa.String(length=64), nullable=False),
        sa.Column('failed_at', sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_token_failures_client_at', 'token_failures', ['client', 'failed_at'], unique=False)
    op.create_index('ix_token_failures_failed_at', 'token_failures', ['failed_at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_token_failures_failed_at', table_name='token_failures')
    op.drop_index('ix_token_failures_client_at', table_name='token_failures')
    op.drop_table('token_failures')
    op.drop_index('ix_web_logins_expires_at', table_name='web_logins')
    op.drop_table('web_logins')
    op.drop_table('web_keys')

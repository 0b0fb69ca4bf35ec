"""notes (every entry writers appended to a problem's notes) and notes_files (the current notes
file of a problem, by its hash in the object store) (issue 27)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07 01:30:00
"""

import sqlalchemy as sa
from alembic import op


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'notes',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('problem_id', sa.Integer(), nullable=False),
        sa.Column('author', sa.String(length=255), nullable=False),
        sa.Column('text', sa.Text(), nullable=False),
        sa.Column('attempt_id', sa.String(length=36), nullable=True),
        sa.Column('shown', sa.String(length=16), nullable=False, server_default='FULL'),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(['attempt_id'], ['attempts.id']),
        sa.ForeignKeyConstraint(['problem_id'], ['problems.id']),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_notes_problem_shown', 'notes', ['problem_id', 'shown'], unique=False)
    op.create_table(
        'notes_files',
        sa.Column('problem_id', sa.Integer(), nullable=False),
        sa.Column('notes_hash', sa.String(length=64), nullable=False),
        sa.Column('entries', sa.Integer(), nullable=False),
        sa.Column('chars', sa.Integer(), nullable=False),
        sa.Column('updated_at', sa.DateTime(), nullable=False),
        sa.Column('trimmed_at', sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(['problem_id'], ['problems.id']),
        sa.PrimaryKeyConstraint('problem_id'),
    )


def downgrade() -> None:
    op.drop_table('notes_files')
    op.drop_index('ix_notes_problem_shown', table_name='notes')
    op.drop_table('notes')

"""sol, budgets, agent cost, baselines, calibrations

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 11:52:55.328942
"""

from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('calibrations',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('hardware', sa.String(length=128), nullable=False),
    sa.Column('bandwidth_gbps', sa.Float(), nullable=True),
    sa.Column('tflops_json', sa.Text(), nullable=False),
    sa.Column('measured_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('baselines',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('problem_id', sa.Integer(), nullable=False),
    sa.Column('workload_uuid', sa.String(length=64), nullable=False),
    sa.Column('hardware', sa.String(length=128), nullable=False),
    sa.Column('eager_ms', sa.Float(), nullable=True),
    sa.Column('compile_ms', sa.Float(), nullable=True),
    sa.Column('measured_at', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['problem_id'], ['problems.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('problem_id', 'workload_uuid', 'hardware')
    )
    with op.batch_alter_table('assignments', schema=None) as batch_op:
        batch_op.add_column(sa.Column('language', sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column('parent_hash', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('guidance', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('lease_until', sa.DateTime(), nullable=True))

    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('sol_score', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('model', sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column('tokens', sa.Integer(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('gpu_seconds', sa.Float(), nullable=True))

    with op.batch_alter_table('campaigns', schema=None) as batch_op:
        batch_op.add_column(sa.Column('policy', sa.String(length=32), nullable=False, server_default='round_robin'))
        batch_op.add_column(sa.Column('budget_attempts', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('budget_gpu_s', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('budget_tokens', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('budget_wall_s', sa.Float(), nullable=True))

    with op.batch_alter_table('traces', schema=None) as batch_op:
        batch_op.add_column(sa.Column('t_sol_ms', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('t_baseline_ms', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('sol_score', sa.Float(), nullable=True))



def downgrade() -> None:
    with op.batch_alter_table('traces', schema=None) as batch_op:
        batch_op.drop_column('sol_score')
        batch_op.drop_column('t_baseline_ms')
        batch_op.drop_column('t_sol_ms')

    with op.batch_alter_table('campaigns', schema=None) as batch_op:
        batch_op.drop_column('budget_wall_s')
        batch_op.drop_column('budget_tokens')
        batch_op.drop_column('budget_gpu_s')
        batch_op.drop_column('budget_attempts')
        batch_op.drop_column('policy')

    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_column('gpu_seconds')
        batch_op.drop_column('tokens')
        batch_op.drop_column('model')
        batch_op.drop_column('sol_score')

    with op.batch_alter_table('assignments', schema=None) as batch_op:
        batch_op.drop_column('lease_until')
        batch_op.drop_column('guidance')
        batch_op.drop_column('parent_hash')
        batch_op.drop_column('language')

    op.drop_table('baselines')
    op.drop_table('calibrations')

"""A run's deadline (decision 38): past it no process of the run can be alive, so a record still
`running` then belongs to a gateway that died, and the next gateway to start closes it."""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("deadline", sa.Double(), nullable=True))
    op.create_index("ix_runs_status_deadline", "runs", ["status", "deadline"])


def downgrade() -> None:
    op.drop_index("ix_runs_status_deadline", "runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("deadline")

"""Which gateways are alive (decision 50): a row per serving process, renewed while it serves.

`gateway_sessions` holds each `serve` process's session (the id its consent questions carry), where
it runs (host, boot id, pid namespace, pid and the pid's start time) and the lease it renews:
`alive_until`; `closed_at` when it stopped cleanly. `runs.session_id` names the gateway that runs a
run. Rows from before this migration have no session: their runs and questions are closed by their
deadline and expiry alone, as before.
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gateway_sessions",
        sa.Column("session_id", sa.String(64), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("boot_id", sa.String(64), nullable=False),
        sa.Column("pid_namespace", sa.String(64), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("pid_started", sa.String(32), nullable=False),
        sa.Column("started_at", sa.Double(), nullable=False),
        sa.Column("alive_until", sa.Double(), nullable=False),
        sa.Column("closed_at", sa.Double(), nullable=True),
    )
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("session_id", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("session_id")
    op.drop_table("gateway_sessions")

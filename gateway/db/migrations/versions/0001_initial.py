"""Initial schema: users, tokens, the hash-chained audit log, budget charges, runs."""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("role", sa.String(64), nullable=False),
        sa.Column("disabled", sa.Boolean(), nullable=False),
        sa.Column("password_hash", sa.String(255), nullable=True),
        sa.Column("created_at", sa.Double(), nullable=False),
    )
    op.create_table(
        "user_workspaces",
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("workspace", sa.String(64), primary_key=True),
    )
    op.create_table(
        "tokens",
        sa.Column("jti", sa.String(64), primary_key=True),
        sa.Column("user_name", sa.String(64), nullable=True),
        sa.Column("issued_at", sa.Double(), nullable=True),
        sa.Column("expires_at", sa.Double(), nullable=True),
        sa.Column("revoked_at", sa.Double(), nullable=True),
    )
    op.create_table(
        "audit_events",
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("ts", sa.String(32), nullable=False),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=True),
        sa.Column("user_name", sa.String(64), nullable=True),
        sa.Column("workspace", sa.String(64), nullable=True),
        sa.Column("tool_name", sa.String(128), nullable=True),
        sa.Column("args_hash", sa.String(64), nullable=True),
        sa.Column("code", sa.Integer(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
    )
    op.create_index("ix_audit_events_run_id", "audit_events", ["run_id"])
    op.create_index("ix_audit_events_ts", "audit_events", ["ts"])
    head = op.create_table(
        "audit_head",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("last_id", sa.BigInteger(), nullable=False),
        sa.Column("last_hash", sa.String(64), nullable=False),
    )
    op.bulk_insert(head, [{"id": 1, "last_id": 0, "last_hash": "0" * 64}])
    op.create_table(
        "budget_charges",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("user_name", sa.String(64), nullable=False),
        sa.Column("ts", sa.Double(), nullable=False),
        sa.Column("elapsed_ms", sa.BigInteger(), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
    )
    op.create_index("ix_budget_charges_user_ts", "budget_charges", ["user_name", "ts"])
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(64), primary_key=True),
        sa.Column("user_name", sa.String(64), nullable=False),
        sa.Column("workspace", sa.String(64), nullable=False),
        sa.Column("tool_name", sa.String(128), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
    )
    op.create_index("ix_runs_workspace", "runs", ["workspace", "created_at"])


def downgrade() -> None:
    for table in (
        "runs",
        "budget_charges",
        "audit_head",
        "audit_events",
        "tokens",
        "user_workspaces",
        "users",
    ):
        op.drop_table(table)

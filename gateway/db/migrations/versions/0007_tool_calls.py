"""The web console's invocation cards (gateway/calls.py): one row per tools/call, moved with its audit events.

`last_event_id` is the audit event written in the same transaction as the row's last change; the
console's live view follows it.
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tool_calls",
        sa.Column("run_id", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.Column("user_name", sa.String(64), nullable=False),
        sa.Column("workspace", sa.String(64), nullable=True),
        sa.Column("server_id", sa.String(128), nullable=False),
        sa.Column("tool_name", sa.String(128), nullable=False),
        sa.Column("arguments", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("code", sa.Integer(), nullable=True),
        sa.Column("reason", sa.String(64), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("result", sa.Text(), nullable=True),
        sa.Column("last_event_id", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_tool_calls_last_event", "tool_calls", ["last_event_id"])
    op.create_index("ix_tool_calls_workspace_event", "tool_calls", ["workspace", "last_event_id"])


def downgrade() -> None:
    op.drop_index("ix_tool_calls_workspace_event", "tool_calls")
    op.drop_index("ix_tool_calls_last_event", "tool_calls")
    op.drop_table("tool_calls")

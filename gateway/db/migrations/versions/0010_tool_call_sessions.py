"""The gateway session of each invocation card (decision 69): what a dead gateway left is found.

A call whose gateway died while it waited (an in-band consent question, the budget, the sandbox's
start) kept its card `pending` and its `MCP_TOOL_CALL` without a terminal event forever: nothing
said which gateway it was waiting in. `tool_calls.session_id` says it (the `gateway_sessions`
row of the serving process; NULL for cards written before this migration), and a partial index
on the open cards lets every sweep find them (gateway/recovery.py). On PostgreSQL the card
insert of `gateway_audit_append` (migration 0009) writes the new column too.
"""

import importlib

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_OPEN = sa.text("status IN ('pending', 'running')")
_PREVIOUS = importlib.import_module("gateway.db.migrations.versions.0009_call_ends").APPEND
_APPEND = _PREVIOUS.replace(
    "arguments, status, code, reason, message, result, last_event_id)",
    "arguments, status, code, reason, message, result, last_event_id, session_id)",
).replace(
    "v_card->>'reason', v_card->>'message', v_card->>'result', v_id);",
    "v_card->>'reason', v_card->>'message', v_card->>'result', v_id,\n                 v_card->>'session_id');",
)
if _APPEND.count("session_id") != 2:
    raise RuntimeError("migration 0010 no longer matches the function of migration 0009")


def upgrade() -> None:
    op.add_column("tool_calls", sa.Column("session_id", sa.String(64), nullable=True))
    op.create_index("ix_tool_calls_open", "tool_calls", ["session_id"], postgresql_where=_OPEN, sqlite_where=_OPEN)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_APPEND)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PREVIOUS)
    op.drop_index("ix_tool_calls_open", "tool_calls")
    with op.batch_alter_table("tool_calls") as batch:
        batch.drop_column("session_id")

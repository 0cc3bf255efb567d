"""A consent question says what it asks, and a call may have one change review decision (decision 80).

`consent_requests.kind` is `call` for every question before this migration and for a call's own;
`change_review` for a `workspace: review` run's change set, whose run is `consent_requests.run_id`
(the approver and the console read changes.patch and changes.json from its artifacts folder).

A call records at most one decision (`call_ends`, migration 0009); the decision on its run's change
set (`mcp.permission.decision` with `detail.about: change_set`) is its own kind, `review`, at most
one too. gateway/audit.py `_end_kind` says the same for SQLite; on PostgreSQL `gateway_audit_append`
reads it from the detail's canonical JSON, where `"about":"change_set"` can only be that key (a quote
inside a string value is always escaped).

A call's card has one more open status, `reviewing` (its run is over, a person decides on its
changes): the partial index of open cards (migration 0010) covers it, so the sweep still finds them
by index.
"""

import importlib

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_DECISION = "v_kind := CASE WHEN p_types[i] = 'mcp.permission.decision' THEN 'decision'"
_REVIEW = (
    "v_kind := CASE WHEN p_types[i] = 'mcp.permission.decision'"
    " AND strpos(p_details[i], '\"about\":\"change_set\"') > 0 THEN 'review'\n"
    "                       WHEN p_types[i] = 'mcp.permission.decision' THEN 'decision'"
)
_PREVIOUS = importlib.import_module("gateway.db.migrations.versions.0010_tool_call_sessions")._APPEND
_APPEND = _PREVIOUS.replace(_DECISION, _REVIEW)
if _PREVIOUS.count(_DECISION) != 2 or _APPEND.count("'review'") != 2:
    raise RuntimeError("migration 0011 no longer matches the function of migration 0010")


_OPEN_BEFORE = sa.text("status IN ('pending', 'running')")
_OPEN = sa.text("status IN ('pending', 'running', 'reviewing')")


def _open_cards_index(where: sa.TextClause) -> None:
    op.drop_index("ix_tool_calls_open", "tool_calls")
    op.create_index("ix_tool_calls_open", "tool_calls", ["session_id"], postgresql_where=where, sqlite_where=where)


def upgrade() -> None:
    op.add_column("consent_requests", sa.Column("kind", sa.String(16), nullable=False, server_default="call"))
    op.add_column("consent_requests", sa.Column("run_id", sa.String(64), nullable=True))
    _open_cards_index(_OPEN)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_APPEND)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PREVIOUS)
    _open_cards_index(_OPEN_BEFORE)
    with op.batch_alter_table("consent_requests") as batch:
        batch.drop_column("run_id")
        batch.drop_column("kind")

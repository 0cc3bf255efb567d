"""A live run's connections still open through the egress proxy (gateway/calls.py, decision 102).

One row per connection a run has open and the proxy has dialled: its host, port and method, its bytes
each way so far, when it opened and when its row was last written. The card's live writer keeps them
(at most about once a second per run, at most the run's open cap); the transaction that writes a
connection's NET_CONNECT deletes its row, and the sweep that closes a dead gateway's run turns what is
left into NET_CONNECT. Nothing before this migration refers to it; downgrading drops the rows (the
audit log never held them).
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "open_connections",
        sa.Column("card_id", sa.String(64), primary_key=True),
        sa.Column("number", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("host", sa.Text(), nullable=True),
        sa.Column("port", sa.Integer(), nullable=True),
        sa.Column("method", sa.String(16), nullable=True),
        sa.Column("address", sa.Text(), nullable=True),
        sa.Column("rule", sa.Text(), nullable=True),
        sa.Column("bytes_up", sa.BigInteger(), nullable=False),
        sa.Column("bytes_down", sa.BigInteger(), nullable=False),
        sa.Column("opened_at", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("open_connections")

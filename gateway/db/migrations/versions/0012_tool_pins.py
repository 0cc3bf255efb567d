"""Upstream tools' pinned definitions (gateway/upstreams/pins.py, decision 85).

One row per upstream and tool the server listed: the definition pinned on first sight or accepted
by an ADMIN (canonical JSON and its sha256), the server's latest when it differs (`changed`) or
its digest alone when it could not be pinned (`refused`, with why), and when and by whom. Nothing
before this migration refers to it; downgrading drops what was pinned.
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tool_pins",
        sa.Column("upstream", sa.String(128), primary_key=True),
        sa.Column("tool", sa.String(128), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("pinned", sa.Text(), nullable=True),
        sa.Column("pinned_sha256", sa.String(64), nullable=True),
        sa.Column("seen", sa.Text(), nullable=True),
        sa.Column("seen_sha256", sa.String(64), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("first_seen_at", sa.Double(), nullable=False),
        sa.Column("pinned_at", sa.Double(), nullable=True),
        sa.Column("changed_at", sa.Double(), nullable=True),
        sa.Column("accepted_by", sa.Text(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("tool_pins")

"""Consent (docs/consent.md): stored decisions, and questions waiting for the terminal approver."""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "consent_grants",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("user_name", sa.String(64), nullable=False),
        sa.Column("workspace", sa.String(64), nullable=False),
        sa.Column("server_id", sa.String(128), nullable=False),
        sa.Column("tool_name", sa.String(128), nullable=False),
        sa.Column("args_hash", sa.String(64), nullable=True),
        sa.Column("decision", sa.String(8), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("granted_at", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=True),
        sa.Column("granted_by", sa.String(128), nullable=False),
        sa.Column("revoked_at", sa.Double(), nullable=True),
    )
    op.create_index("ix_consent_grants_key", "consent_grants", ["user_name", "workspace", "server_id", "tool_name"])
    op.create_table(
        "consent_requests",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.Column("session_id", sa.String(64), nullable=False),
        sa.Column("user_name", sa.String(64), nullable=False),
        sa.Column("workspace", sa.String(64), nullable=False),
        sa.Column("server_id", sa.String(128), nullable=False),
        sa.Column("tool_name", sa.String(128), nullable=False),
        sa.Column("args_hash", sa.String(64), nullable=False),
        sa.Column("args_preview", sa.Text(), nullable=False),
        sa.Column("risk_tier", sa.String(8), nullable=False),
        sa.Column("destructive", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("decision", sa.String(16), nullable=True),
        sa.Column("decided_by", sa.String(128), nullable=True),
        sa.Column("decided_at", sa.Double(), nullable=True),
    )
    op.create_index("ix_consent_requests_status", "consent_requests", ["status", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_consent_requests_status", "consent_requests")
    op.drop_table("consent_requests")
    op.drop_index("ix_consent_grants_key", "consent_grants")
    op.drop_table("consent_grants")

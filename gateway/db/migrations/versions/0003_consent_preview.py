"""A consent question's preview for the approver (docs/claude-code.md): a command, a diff, a URL."""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("consent_requests") as batch:
        batch.add_column(sa.Column("preview", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("consent_requests") as batch:
        batch.drop_column("preview")

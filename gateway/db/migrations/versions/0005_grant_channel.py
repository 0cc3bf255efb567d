"""Who made a stored decision, what a Deny for particular arguments covers, and what the approver may
answer (decisions 43 and 44).

`consent_grants.channel`: filled for existing grants from `granted_by`, which the gateway always
wrote as `approvals:...` (the approver), `cli:...` (`consent grant`) or `elicitation:...`/`client:...`
(the client, in band); anything else stays NULL, read as in band. `consent_grants.arguments`: the
arguments a Deny covers by meaning; NULL for older grants, which keep matching their exact
`args_hash`. `consent_requests.choices`: the decisions the approver may offer; NULL for older
questions, whose choices follow `destructive` as before.
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("consent_grants") as batch:
        batch.add_column(sa.Column("channel", sa.String(16), nullable=True))
        batch.add_column(sa.Column("arguments", sa.Text(), nullable=True))
    with op.batch_alter_table("consent_requests") as batch:
        batch.add_column(sa.Column("choices", sa.String(128), nullable=True))
    grants = sa.table("consent_grants", sa.column("channel", sa.String), sa.column("granted_by", sa.String))
    for prefix, channel in (("approvals:", "approver"), ("cli:", "cli"), ("elicitation:", "elicitation"),
                            ("client:", "elicitation")):  # fmt: skip
        op.execute(
            grants.update().where(grants.c.granted_by.startswith(prefix, autoescape=True)).values(channel=channel)
        )


def downgrade() -> None:
    with op.batch_alter_table("consent_requests") as batch:
        batch.drop_column("choices")
    with op.batch_alter_table("consent_grants") as batch:
        batch.drop_column("arguments")
        batch.drop_column("channel")

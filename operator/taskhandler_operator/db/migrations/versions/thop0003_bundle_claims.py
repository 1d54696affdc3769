"""Bundle and queue ownership: which TaskHandlerBundle owns a bundle name and its queues.

Revision ID: thop0003
Revises: thop0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "thop0003"
down_revision = "thop0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "thop_bundle_claim",
        sa.Column("bundle_name", sa.String(250), nullable=False),
        sa.Column("cluster_id", sa.String(253), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("uid", sa.String(64), nullable=False),
        sa.Column(
            "claimed_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.func.now(),
        ),
        sa.PrimaryKeyConstraint("bundle_name", name="thop_bundle_claim_pkey"),
    )
    op.create_index(
        "idx_thop_bundle_claim_owner", "thop_bundle_claim", ["cluster_id", "namespace", "name"]
    )
    op.create_table(
        "thop_queue_claim",
        sa.Column("queue", sa.String(256), nullable=False),
        sa.Column("bundle_name", sa.String(250), nullable=False),
        sa.Column(
            "claimed_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.func.now(),
        ),
        sa.PrimaryKeyConstraint("queue", name="thop_queue_claim_pkey"),
        sa.ForeignKeyConstraint(
            ["bundle_name"],
            ["thop_bundle_claim.bundle_name"],
            name="thop_queue_claim_bundle_fkey",
            ondelete="CASCADE",
        ),
    )
    op.create_index("idx_thop_queue_claim_bundle", "thop_queue_claim", ["bundle_name"])


def downgrade() -> None:
    op.drop_table("thop_queue_claim")
    op.drop_table("thop_bundle_claim")

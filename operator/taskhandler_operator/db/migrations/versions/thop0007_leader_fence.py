"""The leader fence: the newest leadership term of each operator Lease.

Revision ID: thop0007
Revises: thop0005

Every write transaction compares the replica's term (Lease holder and ``leaseTransitions``)
with this row under the bundle's advisory lock, so a deposed leader's write is refused
(``db/fence.py``). An empty table is the state before any leader recorded a term.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "thop0007"
down_revision = "thop0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "thop_leader_fence",
        sa.Column("cluster_id", sa.String(253), nullable=False),
        sa.Column("lease_namespace", sa.String(253), nullable=False),
        sa.Column("lease_name", sa.String(253), nullable=False),
        sa.Column("lease_uid", sa.String(64), nullable=False),
        sa.Column("holder", sa.Text(), nullable=False),
        sa.Column("transitions", sa.BigInteger(), nullable=False),
        sa.Column(
            "recorded_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.func.now(),
        ),
        sa.PrimaryKeyConstraint(
            "cluster_id", "lease_namespace", "lease_name", name="thop_leader_fence_pkey"
        ),
    )


def downgrade() -> None:
    op.drop_table("thop_leader_fence")

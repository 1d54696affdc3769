"""The publication history: what each publication of a bundle changed.

Revision ID: thop0010
Revises: thop0009

``thop_publication`` records every publication of a bundle (automatic, approved, or a
rollback): its revision, when, which operator replica wrote it, who approved it, the change
set (bindings added, removed, moved, changed) and the whole binding set it published, which a
rollback restores. A bundle's held change (publish policy ``NoRemoval`` or ``Manual``) is one
row of kind ``held``. Rows are numbered per bundle (under the bundle's advisory lock), so
``(bundle_name, id)`` is the key and the newest has the highest id. The write path keeps the
newest ``THOP_PUBLICATION_HISTORY`` publications per bundle.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "thop0010"
down_revision = "thop0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "thop_publication",
        sa.Column("bundle_name", sa.String(250), nullable=False),
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("revision", sa.String(200), nullable=True),
        sa.Column(
            "recorded_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.func.now(),
        ),
        sa.Column("operator", sa.Text(), nullable=False),
        sa.Column("approved_by", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("added", sa.Integer(), nullable=False),
        sa.Column("removed", sa.Integer(), nullable=False),
        sa.Column("moved", sa.Integer(), nullable=False),
        sa.Column("changed", sa.Integer(), nullable=False),
        sa.Column("changes", sa.JSON(), nullable=False),
        sa.Column("bindings", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("bundle_name", "id", name="thop_publication_pkey"),
    )


def downgrade() -> None:
    op.drop_table("thop_publication")

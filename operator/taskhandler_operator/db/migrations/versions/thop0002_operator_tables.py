"""Operator-only bookkeeping: probe revisions and per-bundle problems.

Revision ID: thop0002
Revises: thop0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "thop0002"
down_revision = "thop0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "thop_artifact_probe",
        sa.Column("artifact_id", sa.Uuid(), nullable=False),
        sa.Column("revision", sa.String(200), nullable=True),
        sa.Column("probed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("artifact_id", name="thop_artifact_probe_pkey"),
        sa.ForeignKeyConstraint(
            ["artifact_id"],
            ["lang_sdk_task_handler_artifact.id"],
            name="thop_artifact_probe_artifact_fkey",
            ondelete="CASCADE",
        ),
    )
    op.create_table(
        "thop_bundle_problem",
        sa.Column("bundle_name", sa.String(250), nullable=False),
        sa.Column("problem_key", sa.String(32), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("dag_id", sa.String(250), nullable=True),
        sa.Column("task_id", sa.String(250), nullable=True),
        sa.Column("relative_fileloc", sa.String(2000), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("other_bundle", sa.String(250), nullable=True),
        sa.Column(
            "first_seen_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.func.now(),
        ),
        sa.PrimaryKeyConstraint("bundle_name", "problem_key", name="thop_bundle_problem_pkey"),
    )
    op.create_index("idx_thop_problem_task", "thop_bundle_problem", ["dag_id", "task_id"])
    op.create_index("idx_thop_problem_other_bundle", "thop_bundle_problem", ["other_bundle"])


def downgrade() -> None:
    op.drop_table("thop_bundle_problem")
    op.drop_table("thop_artifact_probe")

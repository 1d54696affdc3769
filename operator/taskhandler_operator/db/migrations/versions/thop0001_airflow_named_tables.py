"""The two Airflow-named binding tables (ADR-0013 Design B), unless Airflow already has them.

Revision ID: thop0001
Revises: (none)

An existing table was checked against the model before this runs (``db/schema_check.py``) and
is adopted as it is. A table this revision creates carries a comment saying so, and only such a
table is dropped on downgrade: an adopted table belongs to Airflow.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "thop0001"
down_revision = None
branch_labels = None
depends_on = None

CREATED_BY = "created by taskhandler-operator"


def _missing(name: str) -> bool:
    return not sa.inspect(op.get_bind()).has_table(name)


def upgrade() -> None:
    if _missing("lang_sdk_task_handler_artifact"):
        op.create_table(
            "lang_sdk_task_handler_artifact",
            sa.Column("id", sa.Uuid(), nullable=False),
            sa.Column("bundle_name", sa.String(250), nullable=False),
            sa.Column("relative_fileloc", sa.String(2000), nullable=False),
            sa.Column("relative_fileloc_hash", sa.String(32), nullable=False),
            sa.Column("size_bytes", sa.BigInteger(), nullable=False),
            sa.Column("cache_digest", sa.String(128), nullable=True),
            sa.Column("task_handlers", sa.JSON(), nullable=False),
            sa.Column("last_probed_at", sa.DateTime(timezone=True), nullable=False),
            sa.PrimaryKeyConstraint("id", name="lang_sdk_task_handler_artifact_pkey"),
            sa.UniqueConstraint(
                "bundle_name", "relative_fileloc_hash", name="lsth_artifact_bundle_fileloc_uq"
            ),
            comment=CREATED_BY,
        )
    if _missing("lang_sdk_task_handler"):
        op.create_table(
            "lang_sdk_task_handler",
            sa.Column("dag_id", sa.String(250), nullable=False),
            sa.Column("task_id", sa.String(250), nullable=False),
            sa.Column("artifact_id", sa.Uuid(), nullable=False),
            sa.Column("dag_bundle_name", sa.String(250), nullable=False),
            sa.Column("dag_relative_fileloc", sa.String(2000), nullable=False),
            sa.Column("dag_relative_fileloc_hash", sa.String(32), nullable=False),
            sa.PrimaryKeyConstraint("dag_id", "task_id", name="lang_sdk_task_handler_pkey"),
            sa.ForeignKeyConstraint(
                ["dag_id"], ["dag.dag_id"], name="lsth_dag_fkey", ondelete="CASCADE"
            ),
            sa.ForeignKeyConstraint(
                ["artifact_id"], ["lang_sdk_task_handler_artifact.id"], name="lsth_artifact_fkey"
            ),
            comment=CREATED_BY,
        )
        op.create_index(
            "idx_lsth_dag_file",
            "lang_sdk_task_handler",
            ["dag_bundle_name", "dag_relative_fileloc_hash"],
        )
        op.create_index("idx_lsth_artifact_id", "lang_sdk_task_handler", ["artifact_id"])


def _created_here(name: str) -> bool:
    comment = sa.inspect(op.get_bind()).get_table_comment(name).get("text")
    return comment == CREATED_BY


def downgrade() -> None:
    for name in ("lang_sdk_task_handler", "lang_sdk_task_handler_artifact"):
        if not _missing(name) and _created_here(name):
            op.drop_table(name)

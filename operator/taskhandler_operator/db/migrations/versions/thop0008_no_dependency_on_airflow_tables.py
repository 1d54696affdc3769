"""No object of the operator depends on a table Airflow owns.

Revision ID: thop0008
Revises: thop0007

``thop_artifact_probe`` had a foreign key (``ON DELETE CASCADE``) into
``lang_sdk_task_handler_artifact``. Where Airflow owns that table (adopted, or created by its
own migration after a handover), the constraint made Airflow's downgrade fail ("cannot drop
table lang_sdk_task_handler_artifact because other objects depend on it") and held a lock
dependency on every change of the table. This revision drops the constraint and the probe rows
whose artifact is gone; from here on the write path deletes a probe row with its artifact.

Downgrade puts the constraint back when the artifact table exists.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "thop0008"
down_revision = "thop0007"
branch_labels = None
depends_on = None

PROBE_FK = "thop_artifact_probe_artifact_fkey"


def _prune_orphans() -> None:
    op.execute(
        "DELETE FROM thop_artifact_probe p WHERE NOT EXISTS "
        "(SELECT 1 FROM lang_sdk_task_handler_artifact a WHERE a.id = p.artifact_id)"
    )


def upgrade() -> None:
    op.execute(f"ALTER TABLE thop_artifact_probe DROP CONSTRAINT IF EXISTS {PROBE_FK}")
    if sa.inspect(op.get_bind()).has_table("lang_sdk_task_handler_artifact"):
        _prune_orphans()


def downgrade() -> None:
    if not sa.inspect(op.get_bind()).has_table("lang_sdk_task_handler_artifact"):
        return
    _prune_orphans()
    op.execute(
        f"ALTER TABLE thop_artifact_probe ADD CONSTRAINT {PROBE_FK} FOREIGN KEY (artifact_id) "
        "REFERENCES lang_sdk_task_handler_artifact (id) ON DELETE CASCADE"
    )

"""The ``dag_ids`` each probe asked about, beside its answer.

Revision ID: thop0009
Revises: thop0008

Probes now send the stub Dags of the bundle's queues as the request's ``dag_ids``. A runtime of
the current protocol ignores them; an older one (and one released TypeScript runtime) answers
only those Dags. So an answer is reused only while it covers the Dags the bundle serves, which
needs the ids it was asked with: ``thop_artifact_probe.requested_dag_ids`` (a JSON array; null
for answers stored before, which were asked nothing and so speak for every Dag).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "thop0009"
down_revision = "thop0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("thop_artifact_probe", sa.Column("requested_dag_ids", sa.JSON()))


def downgrade() -> None:
    op.drop_column("thop_artifact_probe", "requested_dag_ids")

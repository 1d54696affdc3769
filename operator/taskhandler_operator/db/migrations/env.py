"""Alembic environment: runs on the connection :mod:`taskhandler_operator.db.migrate` passes.

The migrations never run from ``alembic.ini``: the caller has already opened a transaction,
taken the migration lock and checked the Airflow-named tables, and hands that connection over
in ``config.attributes["connection"]``.
"""

from __future__ import annotations

from alembic import context

from taskhandler_operator.db.tables import VERSION_TABLE, metadata

connection = context.config.attributes.get("connection")
if connection is None or context.is_offline_mode():
    raise RuntimeError(
        "these migrations run only through `taskhandler-operator db upgrade` "
        "(taskhandler_operator.db.migrate), on a live connection"
    )

context.configure(
    connection=connection,
    target_metadata=metadata,
    # Our own history table, so it coexists with Airflow's alembic_version.
    version_table=VERSION_TABLE,
)
with context.begin_transaction():
    context.run_migrations()

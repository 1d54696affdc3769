"""The parts of Airflow's own metadata tables the operator reads or references.

These are Core ``Table`` stubs in their own ``MetaData``: only the columns we use, never
created, altered or dropped by us (Airflow's ``airflow db migrate`` owns them). Keeping them
out of :data:`taskhandler_operator.db.tables.metadata` means nothing that walks our metadata
(migrations, schema checks) can mistake them for ours.
"""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Uuid,
)
from sqlalchemy.dialects.postgresql import JSONB

from taskhandler_operator.limits import ID_LENGTH, MD5_HEX_LENGTH, PATH_LENGTH, REVISION_LENGTH

airflow_metadata = MetaData()

# Airflow 3.x models/dagbundle.py: version is the bundle's current version (a git commit sha
# for GitDagBundle, NULL for unversioned bundles), active false once it left the configuration.
dag_bundle = Table(
    "dag_bundle",
    airflow_metadata,
    Column("name", String(ID_LENGTH), primary_key=True),
    Column("active", Boolean),
    Column("version", String(REVISION_LENGTH)),
    Column("last_refreshed", DateTime(timezone=True)),
)

dag = Table(
    "dag",
    airflow_metadata,
    Column("dag_id", String(ID_LENGTH), primary_key=True),
    Column("bundle_name", String(ID_LENGTH), nullable=False),
    Column("relative_fileloc", String(PATH_LENGTH)),
    Column("is_stale", Boolean, nullable=False),
)

dag_version = Table(
    "dag_version",
    airflow_metadata,
    Column("id", Uuid, primary_key=True),
    Column("dag_id", String(ID_LENGTH), nullable=False),
    Column("version_number", Integer, nullable=False),
)

serialized_dag = Table(
    "serialized_dag",
    airflow_metadata,
    Column("id", Uuid, primary_key=True),
    Column("dag_id", String(ID_LENGTH), nullable=False),
    Column("data", JSONB),
    Column("data_compressed", LargeBinary),
    Column("dag_hash", String(MD5_HEX_LENGTH), nullable=False),
    Column("dag_version_id", Uuid, nullable=False),
    Column("last_updated", DateTime(timezone=True), nullable=False),
)

#: Tables that must exist before our migrations can run (the binding table's FK needs ``dag``).
REQUIRED_AIRFLOW_TABLES: tuple[str, ...] = ("dag", "dag_version", "serialized_dag")

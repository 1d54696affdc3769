"""DagBundle awareness: does Airflow know the artifact bundle, and at which version?

A binding points at ``(bundle_name, rel_path)``; a worker downloads the artifact from the
Airflow DagBundle of that name. Airflow records each DagBundle it knows in ``dag_bundle``
(``name``, ``active``, ``version``, ``last_refreshed``; 3.x, ``models/dagbundle.py``). So for a
bundle the operator serves:

* no ``dag_bundle`` row, or an inactive one (Airflow no longer finds it in its configuration):
  workers cannot download the artifacts, whatever the bindings say (``UnknownDagBundle``);
* a row whose ``version`` is the revision the bindings were probed at: in sync (``InSync``);
  for git both are the commit sha;
* another version: the workers run other artifacts than the ones checked (``Drift``, with both);
* no version (an unversioned bundle: ``LocalDagBundle``, ``S3DagBundle``), or no revision on
  our side: nobody can tell, and it is never reported as in sync (``VersionUnknown``).

:func:`evaluate` is pure; the reads go through a connection. The result carries the condition
the controller reports (``DagBundleInSync``; a Warning event on drift); until the controller
exists, ``taskhandler-operator db dag-bundle`` prints it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from sqlalchemy import Connection, Text, bindparam, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskhandler_operator.db.airflow_tables import dag_bundle
from taskhandler_operator.db.engine import connection, translate_errors_sync
from taskhandler_operator.db.tables import artifact_table, binding_table, probe_table

CONDITION_TYPE = "DagBundleInSync"

SyncReason = Literal["InSync", "UnknownDagBundle", "Drift", "VersionUnknown"]
ConditionStatus = Literal["True", "False", "Unknown"]

_STATUS: dict[SyncReason, ConditionStatus] = {
    "InSync": "True",
    "UnknownDagBundle": "False",
    "Drift": "False",
    "VersionUnknown": "Unknown",
}


class DagBundleRecord(BaseModel):
    """One row of Airflow's ``dag_bundle``."""

    model_config = ConfigDict(frozen=True)

    name: str
    active: bool | None = None
    version: str | None = None
    last_refreshed: datetime | None = None


class DagBundleSync(BaseModel):
    """The answer for one bundle, shaped as the ``DagBundleInSync`` condition."""

    model_config = ConfigDict(frozen=True)

    bundle_name: str
    reason: SyncReason
    message: str
    # Airflow's current version of the DagBundle, and the revision the bindings were probed at.
    airflow_version: str | None = None
    revision: str | None = None
    last_refreshed: datetime | None = None

    @property
    def status(self) -> ConditionStatus:
        return _STATUS[self.reason]

    @property
    def in_sync(self) -> bool:
        return self.reason == "InSync"

    @property
    def warn(self) -> bool:
        """Whether the controller emits a Warning event (drift only: the others are states)."""
        return self.reason == "Drift"

    def condition(self) -> dict[str, str]:
        return {
            "type": CONDITION_TYPE,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
        }


def evaluate(
    bundle_name: str, revision: str | None, record: DagBundleRecord | None
) -> DagBundleSync:
    """Compare Airflow's ``dag_bundle`` row (None: no row) with the probed ``revision``."""
    base: dict[str, Any] = {"bundle_name": bundle_name, "revision": revision}
    if record is None:
        return DagBundleSync(
            **base,
            reason="UnknownDagBundle",
            message=(
                f"Airflow has no DagBundle {bundle_name!r}, so its workers cannot download the "
                "artifacts the bindings point at; add it to Airflow's [dag_processor] "
                "dag_bundle_config_list, or set spec.bundleName to the DagBundle the workers "
                "download"
            ),
        )
    base |= {"airflow_version": record.version, "last_refreshed": record.last_refreshed}
    if record.active is False:
        return DagBundleSync(
            **base,
            reason="UnknownDagBundle",
            message=(
                f"Airflow's DagBundle {bundle_name!r} is inactive (no longer in its "
                "[dag_processor] dag_bundle_config_list), so its workers cannot download the "
                "artifacts the bindings point at"
            ),
        )
    if record.version is None:
        return DagBundleSync(
            **base,
            reason="VersionUnknown",
            message=(
                f"Airflow records no version for DagBundle {bundle_name!r} (an unversioned "
                "bundle, such as a LocalDagBundle or S3DagBundle), so whether its workers see "
                f"{_revision_words(revision)} cannot be told"
            ),
        )
    if revision is None:
        return DagBundleSync(
            **base,
            reason="VersionUnknown",
            message=(
                f"Airflow's DagBundle {bundle_name!r} is at version {record.version!r}, but no "
                "probe revision is recorded for the bindings, so whether they match cannot be "
                "told"
            ),
        )
    if record.version == revision:
        return DagBundleSync(
            **base,
            reason="InSync",
            message=(
                f"Airflow's DagBundle {bundle_name!r} is at version {record.version!r}, the "
                "revision the bindings were probed at"
            ),
        )
    return DagBundleSync(
        **base,
        reason="Drift",
        message=(
            f"Airflow's DagBundle {bundle_name!r} is at version {record.version!r}, but the "
            f"bindings were probed at revision {revision!r}: workers may run artifacts the "
            "bindings were not checked against"
        ),
    )


def _revision_words(revision: str | None) -> str:
    return f"revision {revision!r}" if revision is not None else "the probed revision"


# --- reads -------------------------------------------------------------------------------------


def _record_statement() -> Any:
    d = dag_bundle
    return select(d.c.name, d.c.active, d.c.version, d.c.last_refreshed).where(
        d.c.name == bindparam("bundle_name", type_=Text())
    )


def _revision_statement() -> Any:
    """The revision of the newest probe among the artifacts the bundle's bindings use.

    Answers the fast path reused keep the revision they were probed at, so this is the newest
    revision a binding was checked against: the controller passes its source revision instead.
    """
    a, b, p = artifact_table, binding_table, probe_table
    bound = select(b.c.artifact_id).where(b.c.artifact_id == a.c.id).exists()
    return (
        select(p.c.revision)
        .join(a, a.c.id == p.c.artifact_id)
        .where(
            a.c.bundle_name == bindparam("bundle_name", type_=Text()),
            p.c.revision.is_not(None),
            bound,
        )
        .order_by(p.c.probed_at.desc(), p.c.revision)
        .limit(1)
    )


def _record(row: Any) -> DagBundleRecord | None:
    if row is None:
        return None
    return DagBundleRecord(
        name=row.name, active=row.active, version=row.version, last_refreshed=row.last_refreshed
    )


def read_dag_bundle_sync(conn: Connection, bundle_name: str) -> DagBundleRecord | None:
    """Airflow's ``dag_bundle`` row for ``bundle_name``, None when Airflow has none."""
    with translate_errors_sync():
        row = conn.execute(_record_statement(), {"bundle_name": bundle_name}).one_or_none()
    return _record(row)


def probed_revision_sync(conn: Connection, bundle_name: str) -> str | None:
    with translate_errors_sync():
        value = conn.execute(_revision_statement(), {"bundle_name": bundle_name}).scalar()
    return None if value is None else str(value)


def dag_bundle_sync_sync(
    conn: Connection, bundle_name: str, revision: str | None = None
) -> DagBundleSync:
    """:func:`evaluate` on the database; ``revision=None`` uses :func:`probed_revision_sync`."""
    if revision is None:
        revision = probed_revision_sync(conn, bundle_name)
    return evaluate(bundle_name, revision, read_dag_bundle_sync(conn, bundle_name))


async def dag_bundle_sync(
    engine: AsyncEngine | AsyncConnection, bundle_name: str, revision: str | None = None
) -> DagBundleSync:
    """The async twin, for the controller (which passes its source revision)."""
    params = {"bundle_name": bundle_name}
    async with connection(engine) as conn:
        if revision is None:
            value = (await conn.execute(_revision_statement(), params)).scalar()
            revision = None if value is None else str(value)
        row = (await conn.execute(_record_statement(), params)).one_or_none()
    return evaluate(bundle_name, revision, _record(row))

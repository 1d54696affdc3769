"""A cheap watermark of the rows one bundle's pass reads and writes.

An unchanged pass may keep its last outcome instead of loading the stored answers, validating
and writing again (:mod:`taskhandler_operator.reconcile.steps`), but only if nobody changed
those rows since: Airflow's Dag processor rewriting an artifact row, an administrator deleting
a binding, another bundle taking a binding of one of the bundle's Dags, a claim released.

One statement answers that: for each set of rows, how many there are and the sum of their
``xmin`` (the id of the transaction that wrote each row version). Any insert, update or delete
changes the count or the sum; the guarded upserts of a pass that changes nothing write no row
version, so they leave it alone. Reading it costs a few index lookups, no JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from sqlalchemy import ARRAY, Text, TextClause, bindparam, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskhandler_operator.db.engine import connection
from taskhandler_operator.db.tables import (
    ARTIFACT_TABLE,
    BINDING_TABLE,
    BUNDLE_CLAIM_TABLE,
    PROBE_TABLE,
    PROBLEM_TABLE,
    QUEUE_CLAIM_TABLE,
)

__all__ = ["RowsWatermark", "rows_watermark", "watermark_statement"]

#: (count, sum of xmin) of each row set, in a fixed order.
RowsWatermark = tuple[int, ...]

_X = "coalesce(sum(xmin::text::bigint), 0)"


@cache
def watermark_statement() -> TextClause:
    """The bundle's artifacts and their probe rows, the bindings of its Dags (whoever holds
    them) and of its artifacts, its problems, its claim and the claims of its queues."""
    # Constant table names; every value is a bound parameter.
    sql = f"""
        WITH a AS (
            SELECT id, xmin::text::bigint AS x FROM {ARTIFACT_TABLE}
            WHERE bundle_name = :bundle_name
        )
        SELECT * FROM
            (SELECT count(*) AS n, coalesce(sum(x), 0) AS x FROM a) AS artifacts,
            (SELECT count(*) AS n, {_X} AS x FROM {PROBE_TABLE}
             WHERE artifact_id IN (SELECT id FROM a)) AS probes,
            (SELECT count(*) AS n, {_X} AS x FROM {BINDING_TABLE}
             WHERE dag_id = ANY(:dag_ids) OR artifact_id IN (SELECT id FROM a)) AS bindings,
            (SELECT count(*) AS n, {_X} AS x FROM {PROBLEM_TABLE}
             WHERE bundle_name = :bundle_name) AS problems,
            (SELECT count(*) AS n, {_X} AS x FROM {BUNDLE_CLAIM_TABLE}
             WHERE bundle_name = :bundle_name) AS bundle_claim,
            (SELECT count(*) AS n, {_X} AS x FROM {QUEUE_CLAIM_TABLE}
             WHERE queue = ANY(:queues) OR bundle_name = :bundle_name) AS queue_claims
    """  # noqa: S608
    return text(sql).bindparams(
        bindparam("bundle_name", type_=Text()),
        bindparam("dag_ids", type_=ARRAY(Text())),
        bindparam("queues", type_=ARRAY(Text())),
    )


async def rows_watermark(
    engine: AsyncEngine | AsyncConnection,
    bundle_name: str,
    dag_ids: Sequence[str],
    queues: Sequence[str],
) -> RowsWatermark:
    """The watermark of ``bundle_name``'s rows and of the bindings of ``dag_ids``."""
    params = {"bundle_name": bundle_name, "dag_ids": list(dag_ids), "queues": list(queues)}
    async with connection(engine) as conn:
        row = (await conn.execute(watermark_statement(), params)).one()
    return tuple(int(v) for v in row)

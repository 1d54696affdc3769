"""A table's full definition as PostgreSQL's catalog holds it, for exact comparisons.

Independent of the package's own catalog reader (``db/catalog.py``) on purpose: this one dumps
the catalog's own renderings (``format_type``, ``pg_get_constraintdef``, ``pg_get_indexdef``,
``pg_get_expr``, the comment functions) and compares them as plain values, so a blind spot of
the package's reader cannot hide a difference here.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

COLUMNS = sa.text(
    """
    SELECT a.attnum, a.attname, format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull,
           pg_get_expr(d.adbin, d.adrelid) AS default, a.attidentity, a.attgenerated,
           col_description(a.attrelid, a.attnum) AS comment, co.collname
    FROM pg_attribute a
    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
    LEFT JOIN pg_collation co ON co.oid = a.attcollation
    WHERE a.attrelid = to_regclass(:table) AND a.attnum > 0 AND NOT a.attisdropped
    ORDER BY a.attnum
    """
)
CONSTRAINTS = sa.text(
    """
    SELECT conname, contype, pg_get_constraintdef(oid) AS definition, condeferrable,
           condeferred, convalidated
    FROM pg_constraint WHERE conrelid = to_regclass(:table) ORDER BY conname
    """
)
INDEXES = sa.text(
    """
    SELECT c.relname, pg_get_indexdef(i.indexrelid) AS definition, i.indisunique,
           i.indisprimary, i.indisvalid, obj_description(i.indexrelid, 'pg_class') AS comment
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    WHERE i.indrelid = to_regclass(:table) ORDER BY c.relname
    """
)
TABLE = sa.text(
    """
    SELECT c.relkind, c.relpersistence, obj_description(c.oid, 'pg_class') AS comment,
           c.reloptions
    FROM pg_class c WHERE c.oid = to_regclass(:table)
    """
)


def catalog_snapshot(conn: sa.Connection, table: str) -> dict[str, Any]:
    """Everything that defines ``table``: columns in order, constraints and indexes by name."""
    params = {"table": table}
    found = conn.execute(TABLE, params).mappings().one_or_none()
    if found is None:
        raise AssertionError(f"table {table!r} does not exist")
    return {
        "table": dict(found),
        "columns": [dict(row) for row in conn.execute(COLUMNS, params).mappings()],
        "constraints": {
            row["conname"]: dict(row) for row in conn.execute(CONSTRAINTS, params).mappings()
        },
        "indexes": {row["relname"]: dict(row) for row in conn.execute(INDEXES, params).mappings()},
    }


def snapshots(url: str, tables: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return {table: catalog_snapshot(conn, table) for table in tables}
    finally:
        engine.dispose()

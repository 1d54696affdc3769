"""Exact definitions: is a table what the model says, name by name?

:mod:`~taskhandler_operator.db.schema_check` answers "can the operator use this table"; this
module answers "is it the same table", which is what Airflow's later migrations (they drop and
alter constraints and indexes by name) and its schema-drift checks need. A
:class:`TableDefinition` holds what defines a table in PostgreSQL's own renderings: each column's
``format_type``, ``NOT NULL``, default expression and comment; each constraint by name with its
``pg_get_constraintdef``; each index by name with its ``pg_get_indexdef`` minus the name and
table; the table comment.

:func:`expected_definition` derives it from a SQLAlchemy ``Table`` (pure);
:func:`read_definition` reads it from the catalog; :func:`compare_definitions` names every
difference, and says when an object only carries another name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Connection,
    DateTime,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    Uuid,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.types import TypeEngine


@dataclass(frozen=True)
class ColumnDefinition:
    name: str
    type: str  # as format_type() renders it: "character varying(250)", "uuid", ...
    not_null: bool
    default: str | None = None
    comment: str | None = None


@dataclass(frozen=True)
class TableDefinition:
    name: str
    columns: dict[str, ColumnDefinition]
    # name -> pg_get_constraintdef(): "PRIMARY KEY (id)", "FOREIGN KEY (a) REFERENCES t(b) ..."
    constraints: dict[str, str]
    # name -> "btree (a, b)" or "UNIQUE btree (a)"; the indexes behind constraints included
    indexes: dict[str, str]
    comment: str | None = None
    constraint_indexes: frozenset[str] = field(default_factory=frozenset)


# --- from the model ----------------------------------------------------------------------------


def pg_type(type_: TypeEngine[Any]) -> str:
    """How ``format_type`` renders the column type SQLAlchemy creates for ``type_``."""
    if isinstance(type_, JSONB):
        return "jsonb"
    if isinstance(type_, JSON):
        return "json"
    if isinstance(type_, Uuid):
        return "uuid"
    if isinstance(type_, DateTime):
        return "timestamp with time zone" if type_.timezone else "timestamp without time zone"
    if isinstance(type_, Text):
        return "text"
    if isinstance(type_, String):
        return f"character varying({type_.length})" if type_.length else "character varying"
    if isinstance(type_, BigInteger):
        return "bigint"
    if isinstance(type_, Integer):
        return "integer"
    if isinstance(type_, Boolean):
        return "boolean"
    if isinstance(type_, LargeBinary):
        return "bytea"
    raise TypeError(f"no PostgreSQL rendering known for {type_!r}")


def _names(columns: Iterable[Any]) -> str:
    return ", ".join(c.name for c in columns)


def _default(server_default: Any) -> str | None:
    if server_default is None:
        return None
    compiled = server_default.arg.compile(dialect=postgresql.dialect())
    return str(compiled)


def _fk_definition(fk: ForeignKeyConstraint) -> str:
    referred = fk.elements[0].column.table.name
    definition = (
        f"FOREIGN KEY ({_names(fk.columns)}) REFERENCES "
        f"{referred}({', '.join(e.column.name for e in fk.elements)})"
    )
    # PostgreSQL renders only actions other than the default NO ACTION.
    if fk.onupdate and fk.onupdate.upper() != "NO ACTION":
        definition += f" ON UPDATE {fk.onupdate.upper()}"
    if fk.ondelete and fk.ondelete.upper() != "NO ACTION":
        definition += f" ON DELETE {fk.ondelete.upper()}"
    return definition


def expected_definition(table: Table) -> TableDefinition:
    """The definition creating ``table`` from the model gives (every name must be explicit)."""
    columns = {
        c.name: ColumnDefinition(
            name=c.name,
            type=pg_type(c.type),
            not_null=not c.nullable,
            default=_default(c.server_default),
            comment=c.comment,
        )
        for c in table.columns
    }
    constraints: dict[str, str] = {}
    indexes: dict[str, str] = {}
    backing: set[str] = set()
    for constraint in table.constraints:
        name = constraint.name
        if not isinstance(name, str):
            raise ValueError(f"table {table.name!r} has a constraint without an explicit name")
        if isinstance(constraint, PrimaryKeyConstraint):
            constraints[name] = f"PRIMARY KEY ({_names(constraint.columns)})"
        elif isinstance(constraint, UniqueConstraint):
            constraints[name] = f"UNIQUE ({_names(constraint.columns)})"
        elif isinstance(constraint, ForeignKeyConstraint):
            constraints[name] = _fk_definition(constraint)
            continue
        else:  # pragma: no cover - the models declare no other kind
            raise ValueError(f"constraint {name!r}: kind {type(constraint).__name__} not handled")
        indexes[name] = f"UNIQUE btree ({_names(constraint.columns)})"
        backing.add(name)
    for index in table.indexes:
        indexes[_index_name(index)] = _index_definition(index)
    return TableDefinition(
        name=table.name,
        columns=columns,
        constraints=constraints,
        indexes=indexes,
        comment=table.comment,
        constraint_indexes=frozenset(backing),
    )


def _index_name(index: Index) -> str:
    if not isinstance(index.name, str):
        raise ValueError(f"table {index.table!r} has an index without an explicit name")
    return index.name


def _index_definition(index: Index) -> str:
    unique = "UNIQUE " if index.unique else ""
    return f"{unique}btree ({_names(index.columns)})"


# --- from the catalog --------------------------------------------------------------------------

_COLUMNS = text(
    """
    SELECT a.attname, format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull,
           pg_get_expr(d.adbin, d.adrelid) AS default, col_description(a.attrelid, a.attnum)
           AS comment
    FROM pg_attribute a
    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
    WHERE a.attrelid = to_regclass(:table) AND a.attnum > 0 AND NOT a.attisdropped
    ORDER BY a.attnum
    """
)
_CONSTRAINTS = text(
    """
    SELECT conname, pg_get_constraintdef(oid) AS definition, conindid <> 0 AS has_index
    FROM pg_constraint WHERE conrelid = to_regclass(:table) AND contype <> 'n'
    """
)
_INDEXES = text(
    """
    SELECT c.relname, pg_get_indexdef(i.indexrelid) AS definition
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    WHERE i.indrelid = to_regclass(:table)
    """
)
_TABLE = text("SELECT obj_description(to_regclass(:table), 'pg_class'), to_regclass(:table)")

# "CREATE [UNIQUE] INDEX name ON [ONLY] schema.table USING btree (a, b) [WHERE ...]"
_INDEXDEF = re.compile(r"^CREATE (UNIQUE )?INDEX \S+ ON (?:ONLY )?\S+ USING (.*)$")


def index_body(definition: str) -> str:
    """``pg_get_indexdef`` without the index and table names, which are compared apart."""
    match = _INDEXDEF.match(definition)
    if match is None:  # pragma: no cover - PostgreSQL always renders this shape
        return definition
    return f"{match.group(1) or ''}{match.group(2)}"


def read_definition(conn: Connection, name: str) -> TableDefinition | None:
    """The definition of table ``name`` (resolved through ``search_path``); None if absent."""
    params = {"table": name}
    comment, oid = conn.execute(_TABLE, params).one()
    if oid is None:
        return None
    columns = {
        row.attname: ColumnDefinition(
            name=row.attname,
            type=row.type,
            not_null=row.attnotnull,
            default=row.default,
            comment=row.comment,
        )
        for row in conn.execute(_COLUMNS, params)
    }
    constraints: dict[str, str] = {}
    backing: set[str] = set()
    for row in conn.execute(_CONSTRAINTS, params):
        constraints[row.conname] = row.definition
        if row.has_index and not row.definition.startswith("FOREIGN KEY"):
            backing.add(row.conname)
    indexes = {row.relname: index_body(row.definition) for row in conn.execute(_INDEXES, params)}
    return TableDefinition(
        name=name,
        columns=columns,
        constraints=constraints,
        indexes=indexes,
        comment=comment,
        constraint_indexes=frozenset(backing),
    )


# --- comparing ---------------------------------------------------------------------------------


def _column_words(column: ColumnDefinition) -> str:
    words = column.type + (" NOT NULL" if column.not_null else "")
    return words + (f" DEFAULT {column.default}" if column.default is not None else "")


def _compare_columns(expected: TableDefinition, observed: TableDefinition, model: str) -> list[str]:
    found: list[str] = []
    for name, want in expected.columns.items():
        have = observed.columns.get(name)
        if have is None:
            found.append(f"column {name!r} ({_column_words(want)}) is missing")
            continue
        if (have.type, have.not_null, have.default) != (want.type, want.not_null, want.default):
            found.append(
                f"column {name!r} is {_column_words(have)}, {model} has {_column_words(want)}"
            )
        if have.comment != want.comment:
            found.append(
                f"column {name!r} has comment {have.comment!r}, {model} has {want.comment!r}"
            )
    for name, have in observed.columns.items():
        if name not in expected.columns:
            found.append(f"column {name!r} ({_column_words(have)}) is not in {model}")
    return found


def _compare_named(
    kind: str, expected: dict[str, str], observed: dict[str, str], model: str
) -> list[str]:
    """Objects compared by name; one that only differs by name is reported as such."""
    found: list[str] = []
    unmatched = {name: body for name, body in observed.items() if name not in expected}
    for name, want in expected.items():
        have = observed.get(name)
        if have == want:
            continue
        if have is not None:
            found.append(f"{kind} {name!r} is {have}, {model} has {want}")
            continue
        renamed = next((other for other, body in unmatched.items() if body == want), None)
        if renamed is not None:
            del unmatched[renamed]
            found.append(f"{kind} {renamed!r} ({want}) is named {name!r} in {model}")
        else:
            found.append(f"{kind} {name!r} ({want}) is missing")
    for name, body in unmatched.items():
        found.append(f"{kind} {name!r} ({body}) is not in {model}")
    return found


def compare_definitions(
    expected: TableDefinition, observed: TableDefinition, model: str = "the model"
) -> list[str]:
    """Every difference of ``observed`` from ``expected``, by name; empty when identical.

    Column order is not compared (nothing reads by position). Indexes behind a constraint are
    reported through their constraint only.
    """
    found = _compare_columns(expected, observed, model)
    found += _compare_named("constraint", expected.constraints, observed.constraints, model)
    skip = expected.constraint_indexes | observed.constraint_indexes
    found += _compare_named(
        "index",
        {n: d for n, d in expected.indexes.items() if n not in skip},
        {n: d for n, d in observed.indexes.items() if n not in skip},
        model,
    )
    if observed.comment != expected.comment:
        if expected.comment is None:
            found.append(f"table comment {observed.comment!r} is not in {model}")
        else:
            found.append(f"table comment is {observed.comment!r}, {model} has {expected.comment!r}")
    return found

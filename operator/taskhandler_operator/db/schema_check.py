"""Adopt-or-refuse: does an existing table have the shape our code needs?

An Airflow release that ships ``lang_sdk_task_handler_artifact`` / ``lang_sdk_task_handler``
creates them itself; the operator then uses them as they are. Before adopting a table we
compare it with our model, and stop with the first differences named if it would not work.

What must match: every column we use (type family and nullability; a ``VARCHAR`` may be longer
than ours, and ``json``/``jsonb`` are interchangeable because every comparison we run casts to
``jsonb``), the primary key, the unique key our upserts conflict on, and the foreign keys with
their ``ON DELETE`` action. Extra columns are fine when they are nullable or have a default
(a newer Airflow may add some); an extra ``NOT NULL`` column without a default is not, since
our inserts could never fill it. Indexes are not compared: they change speed, not meaning.

:func:`compare_tables` is pure; :func:`observed_shape` reads the catalog through a sync
connection (use ``AsyncConnection.run_sync`` from async code).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Connection,
    DateTime,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    UniqueConstraint,
    Uuid,
    inspect,
)
from sqlalchemy.types import TypeEngine

from taskhandler_operator.db.tables import metadata

MAX_LISTED_DIFFERENCES = 3


@dataclass(frozen=True)
class ColumnShape:
    name: str
    family: str
    length: int | None
    nullable: bool
    has_default: bool = False

    def describe(self) -> str:
        return f"{self.family}({self.length})" if self.length else self.family


@dataclass(frozen=True)
class ForeignKeyShape:
    columns: tuple[str, ...]
    referred_table: str
    referred_columns: tuple[str, ...]
    ondelete: str  # upper case; "NO ACTION" when unspecified

    def describe(self) -> str:
        return (
            f"({', '.join(self.columns)}) -> {self.referred_table}"
            f"({', '.join(self.referred_columns)}) ON DELETE {self.ondelete}"
        )


@dataclass(frozen=True)
class TableShape:
    name: str
    columns: dict[str, ColumnShape]
    primary_key: tuple[str, ...]
    unique_keys: frozenset[frozenset[str]] = field(default_factory=frozenset)
    foreign_keys: frozenset[ForeignKeyShape] = field(default_factory=frozenset)


def type_family(type_: TypeEngine[Any]) -> str:
    """A coarse name for a column type; ``varchar`` lengths are compared separately."""
    if isinstance(type_, JSON):  # JSONB subclasses JSON
        return "json"
    if isinstance(type_, Uuid):
        return "uuid"
    if isinstance(type_, DateTime):
        return "timestamptz" if type_.timezone else "timestamp"
    if isinstance(type_, Text):
        return "text"
    if isinstance(type_, String):
        return "varchar"
    if isinstance(type_, BigInteger):
        return "bigint"
    if isinstance(type_, Integer):
        return "integer"
    if isinstance(type_, Boolean):
        return "boolean"
    if isinstance(type_, LargeBinary):
        return "bytea"
    return type(type_).__name__.lower()


def _length(type_: TypeEngine[Any]) -> int | None:
    if isinstance(type_, String) and not isinstance(type_, Text):
        return type_.length
    return None


def _ondelete(value: str | None) -> str:
    return (value or "NO ACTION").upper()


def expected_shape(table: Table) -> TableShape:
    """The shape our model declares for ``table``."""
    columns = {
        c.name: ColumnShape(
            name=c.name,
            family=type_family(c.type),
            length=_length(c.type),
            nullable=bool(c.nullable),
            has_default=c.server_default is not None,
        )
        for c in table.columns
    }
    uniques = {
        frozenset(col.name for col in constraint.columns)
        for constraint in table.constraints
        if isinstance(constraint, UniqueConstraint)
    }
    fks = {
        ForeignKeyShape(
            columns=tuple(col.name for col in fk.columns),
            referred_table=fk.referred_table.name,
            referred_columns=tuple(el.column.name for el in fk.elements),
            ondelete=_ondelete(fk.ondelete),
        )
        for fk in table.foreign_key_constraints
    }
    return TableShape(
        name=table.name,
        columns=columns,
        primary_key=tuple(col.name for col in table.primary_key.columns),
        unique_keys=frozenset(uniques),
        foreign_keys=frozenset(fks),
    )


def observed_shape(conn: Connection, name: str) -> TableShape | None:
    """The shape of the table in the database, or None when it does not exist."""
    inspector = inspect(conn)
    if not inspector.has_table(name):
        return None
    columns = {
        c["name"]: ColumnShape(
            name=c["name"],
            family=type_family(c["type"]),
            length=_length(c["type"]),
            nullable=bool(c["nullable"]),
            has_default=c.get("default") is not None or bool(c.get("identity")),
        )
        for c in inspector.get_columns(name)
    }
    pk = inspector.get_pk_constraint(name)
    uniques = {frozenset(u["column_names"]) for u in inspector.get_unique_constraints(name)}
    # A unique index serves ON CONFLICT as well as a constraint does (unless it is partial).
    for index in inspector.get_indexes(name):
        if index.get("unique") and not index.get("dialect_options", {}).get("postgresql_where"):
            uniques.add(frozenset(c for c in index["column_names"] if c is not None))
    fks = {
        ForeignKeyShape(
            columns=tuple(fk["constrained_columns"]),
            referred_table=fk["referred_table"],
            referred_columns=tuple(fk["referred_columns"]),
            ondelete=_ondelete(fk.get("options", {}).get("ondelete")),
        )
        for fk in inspector.get_foreign_keys(name)
    }
    return TableShape(
        name=name,
        columns=columns,
        primary_key=tuple(pk.get("constrained_columns") or ()),
        unique_keys=frozenset(uniques),
        foreign_keys=frozenset(fks),
    )


def compare_tables(expected: TableShape, observed: TableShape) -> list[str]:
    """Why ``observed`` cannot be used where ``expected`` is needed; empty when it can."""
    differences: list[str] = []
    for name, want in expected.columns.items():
        have = observed.columns.get(name)
        if have is None:
            differences.append(f"column {name!r} is missing")
            continue
        if have.family != want.family:
            differences.append(f"column {name!r} is {have.describe()}, expected {want.describe()}")
        elif want.length is not None and have.length is not None and have.length < want.length:
            differences.append(
                f"column {name!r} is {have.describe()}, shorter than {want.describe()}"
            )
        if have.nullable != want.nullable:
            state = "nullable" if have.nullable else "NOT NULL"
            wanted = "nullable" if want.nullable else "NOT NULL"
            differences.append(f"column {name!r} is {state}, expected {wanted}")
    for name, have in observed.columns.items():
        if name not in expected.columns and not have.nullable and not have.has_default:
            differences.append(
                f"extra column {name!r} is NOT NULL without a default, so no row could be inserted"
            )
    if tuple(observed.primary_key) != tuple(expected.primary_key):
        differences.append(
            f"primary key is ({', '.join(observed.primary_key)}), "
            f"expected ({', '.join(expected.primary_key)})"
        )
    for unique in sorted(expected.unique_keys, key=sorted):
        if unique not in observed.unique_keys:
            differences.append(f"no unique key on ({', '.join(sorted(unique))})")
    observed_fks = {fk.columns: fk for fk in observed.foreign_keys}
    for fk in sorted(expected.foreign_keys, key=lambda f: f.columns):
        have_fk = observed_fks.get(fk.columns)
        if have_fk is None:
            differences.append(f"foreign key {fk.describe()} is missing")
        elif have_fk != fk:
            differences.append(f"foreign key is {have_fk.describe()}, expected {fk.describe()}")
    return differences


def summarize(table: str, differences: Sequence[str]) -> str:
    """One line naming the first differences."""
    shown = "; ".join(differences[:MAX_LISTED_DIFFERENCES])
    more = len(differences) - MAX_LISTED_DIFFERENCES
    suffix = f" (and {more} more)" if more > 0 else ""
    return f"table {table!r} exists with a different shape: {shown}{suffix}"


def check_tables(conn: Connection, names: Iterable[str]) -> dict[str, list[str]]:
    """Differences of each existing table among ``names`` from our model (missing: skipped)."""
    found: dict[str, list[str]] = {}
    for name in names:
        observed = observed_shape(conn, name)
        if observed is None:
            continue
        differences = compare_tables(expected_shape(metadata.tables[name]), observed)
        if differences:
            found[name] = differences
    return found

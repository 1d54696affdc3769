"""Adopt-or-refuse comparison of table shapes (pure)."""

from __future__ import annotations

import dataclasses

from taskhandler_operator.db.schema_check import (
    ColumnShape,
    ForeignKeyShape,
    TableShape,
    compare_tables,
    expected_shape,
    summarize,
)
from taskhandler_operator.db.tables import artifact_table, binding_table


def test_model_shapes_follow_design_b() -> None:
    artifact = expected_shape(artifact_table)
    assert artifact.primary_key == ("id",)
    assert artifact.unique_keys == frozenset({frozenset({"bundle_name", "relative_fileloc_hash"})})
    assert artifact.columns["relative_fileloc"] == ColumnShape(
        "relative_fileloc", "varchar", 2000, False
    )
    assert artifact.columns["relative_fileloc_hash"].length == 32
    assert artifact.columns["cache_digest"] == ColumnShape("cache_digest", "varchar", 128, True)
    assert artifact.columns["size_bytes"].family == "bigint"
    assert artifact.columns["task_handlers"].family == "json"
    assert artifact.columns["last_probed_at"].family == "timestamptz"
    binding = expected_shape(binding_table)
    assert binding.primary_key == ("dag_id", "task_id")
    assert binding.foreign_keys == frozenset(
        {
            ForeignKeyShape(("dag_id",), "dag", ("dag_id",), "CASCADE"),
            ForeignKeyShape(
                ("artifact_id",), "lang_sdk_task_handler_artifact", ("id",), "NO ACTION"
            ),
        }
    )
    assert sorted(binding.columns) == [
        "artifact_id",
        "dag_bundle_name",
        "dag_id",
        "dag_relative_fileloc",
        "dag_relative_fileloc_hash",
        "task_id",
    ]


def _with_column(shape: TableShape, column: ColumnShape) -> TableShape:
    return dataclasses.replace(shape, columns={**shape.columns, column.name: column})


def test_same_shape_has_no_differences() -> None:
    shape = expected_shape(artifact_table)
    assert compare_tables(shape, shape) == []


def test_tolerated_variations() -> None:
    want = expected_shape(artifact_table)
    have = _with_column(want, ColumnShape("relative_fileloc", "varchar", 4000, False))
    have = _with_column(have, ColumnShape("note", "text", None, True))
    have = _with_column(have, ColumnShape("created", "timestamptz", None, False, has_default=True))
    assert compare_tables(want, have) == []


def test_differences_are_named() -> None:
    want = expected_shape(artifact_table)
    have = dataclasses.replace(
        want,
        columns={
            **{k: v for k, v in want.columns.items() if k != "relative_fileloc_hash"},
            "cache_digest": ColumnShape("cache_digest", "varchar", 64, False),
            "size_bytes": ColumnShape("size_bytes", "integer", None, False),
            "extra": ColumnShape("extra", "text", None, False),
        },
        primary_key=("bundle_name", "relative_fileloc"),
        unique_keys=frozenset({frozenset({"bundle_name", "relative_fileloc"})}),
    )
    assert compare_tables(want, have) == [
        "column 'relative_fileloc_hash' is missing",
        "column 'size_bytes' is integer, expected bigint",
        "column 'cache_digest' is varchar(64), shorter than varchar(128)",
        "column 'cache_digest' is NOT NULL, expected nullable",
        "extra column 'extra' is NOT NULL without a default, so no row could be inserted",
        "primary key is (bundle_name, relative_fileloc), expected (id)",
        "no unique key on (bundle_name, relative_fileloc_hash)",
    ]


def test_foreign_key_differences() -> None:
    want = expected_shape(binding_table)
    have = dataclasses.replace(
        want,
        foreign_keys=frozenset({ForeignKeyShape(("dag_id",), "dag", ("dag_id",), "NO ACTION")}),
    )
    assert compare_tables(want, have) == [
        "foreign key (artifact_id) -> lang_sdk_task_handler_artifact(id) ON DELETE NO ACTION "
        "is missing",
        "foreign key is (dag_id) -> dag(dag_id) ON DELETE NO ACTION, expected (dag_id) -> "
        "dag(dag_id) ON DELETE CASCADE",
    ]


def test_summary_names_the_first_three() -> None:
    text = summarize("t", ["a", "b", "c", "d", "e"])
    assert text == "table 't' exists with a different shape: a; b; c (and 2 more)"
    assert summarize("t", ["a"]) == "table 't' exists with a different shape: a"

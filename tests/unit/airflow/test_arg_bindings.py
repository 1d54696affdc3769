"""``_arg_bindings`` parsing: good shapes become models, odd ones become problems."""

from __future__ import annotations

from typing import Any

import pytest

from taskhandler_operator.airflow.arg_bindings import (
    LiteralArgBinding,
    XComArgBinding,
    is_passed,
    parse_arg_bindings,
)


def test_absent_means_argless() -> None:
    parsed = parse_arg_bindings(None)
    assert parsed.bindings is None and parsed.problems == ()


def test_empty_list_is_no_arguments() -> None:
    parsed = parse_arg_bindings([])
    assert parsed.bindings == () and parsed.problems == ()


def test_xcom_and_literal_in_order() -> None:
    parsed = parse_arg_bindings(
        [
            {
                "name": "rows",
                "kind": "xcom",
                "task_id": "extract",
                "value_schema": {"type": "array"},
            },
            {"name": "limit", "kind": "literal", "value": 5, "from_default": True},
            {"name": "label", "kind": "literal", "value": None},
        ]
    )
    assert parsed.problems == ()
    assert parsed.bindings is not None
    rows, limit, label = parsed.bindings
    assert isinstance(rows, XComArgBinding) and rows.task_id == "extract"
    assert rows.value_schema == {"type": "array"}
    assert isinstance(limit, LiteralArgBinding) and limit.value == 5 and limit.from_default
    assert isinstance(label, LiteralArgBinding) and label.value is None
    assert [is_passed(b) for b in parsed.bindings] == [True, False, True]


def test_null_value_schema_reads_as_omitted_and_unknown_keys_are_ignored() -> None:
    parsed = parse_arg_bindings(
        [{"name": "a", "kind": "literal", "value": 1, "value_schema": None, "future": 1}]
    )
    assert parsed.bindings is not None and parsed.bindings[0].value_schema is None


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("x", "_arg_bindings is a string, expected a list of arguments"),
        ({"a": 1}, "_arg_bindings is an object, expected a list of arguments"),
        (3, "_arg_bindings is a number, expected a list of arguments"),
        ([1], "_arg_bindings[0] is a number, expected an object"),
        ([None], "_arg_bindings[0] is null, expected an object"),
        (
            [{"name": "a", "kind": "env", "value": 1}],
            "_arg_bindings[0] ('a') has unknown binding kind 'env', expected 'xcom' or 'literal'",
        ),
        (
            [{"name": "a"}],
            "_arg_bindings[0] ('a') has unknown binding kind null, expected 'xcom' or 'literal'",
        ),
        (
            [{"name": "a", "kind": "literal"}],
            "_arg_bindings[0] ('a') is a literal without a value",
        ),
        (
            [{"name": "a", "kind": "xcom"}],
            "_arg_bindings[0] ('a'): task_id: Field required",
        ),
        (
            [{"kind": "literal", "value": 1}],
            "_arg_bindings[0]: name: Field required",
        ),
        (
            [{"name": "a", "kind": "literal", "value": 1, "value_schema": "int"}],
            "_arg_bindings[0] ('a'): value_schema: Input should be a valid dictionary",
        ),
        (
            [{"name": "a", "kind": "literal", "value": 1, "from_default": "yes"}],
            "_arg_bindings[0] ('a'): from_default: Input should be a valid boolean",
        ),
        (
            [
                {"name": "a", "kind": "literal", "value": 1},
                {"name": "a", "kind": "literal", "value": 2},
            ],
            "_arg_bindings names argument 'a' twice",
        ),
    ],
)
def test_odd_shapes_become_problems(raw: Any, problem: str) -> None:
    parsed = parse_arg_bindings(raw)
    assert parsed.bindings is None
    assert parsed.problems == (problem,)


def test_every_bad_entry_is_reported() -> None:
    parsed = parse_arg_bindings([1, {"name": "ok", "kind": "literal", "value": 1}, "x"])
    assert parsed.problems == (
        "_arg_bindings[0] is a number, expected an object",
        "_arg_bindings[2] is a string, expected an object",
    )

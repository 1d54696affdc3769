"""Shared primitives of the readers: modes, quoting of untrusted text."""

from __future__ import annotations

import pytest

from taskhandler_operator.artifacts.models import excerpt, is_executable


@pytest.mark.parametrize(
    ("mode", "executable"),
    [(0o100, True), (0o010, True), (0o001, True), (0o644, False), (0o000, False)],
)
def test_any_execute_bit_makes_a_file_executable(mode: int, executable: bool) -> None:
    assert is_executable(mode) is executable


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain", "plain"),
        ("a\nb\x00c\u2028", "a\\nb\\x00c\\u2028"),
        ("x" * 200, "x" * 200),
        ("x" * 201, "x" * 200 + "…"),
    ],
)
def test_excerpt_escapes_and_cuts(text: str, shown: str) -> None:
    assert excerpt(text) == shown

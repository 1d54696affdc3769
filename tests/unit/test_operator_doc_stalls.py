"""docs/operator.md's "Stalled or retrying" table says what kube/conditions.py does: every reason
a condition can be False with is listed once, with the verdict ``stalls()`` gives it."""

from __future__ import annotations

import re
from pathlib import Path

from taskhandler_operator.kube.conditions import RETRIES, STALLS, stalls
from taskhandler_operator.sources import errors as source_errors

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operator.md"


def table() -> dict[str, str]:
    page = PAGE.read_text(encoding="utf-8")
    start = page.index("\n### Stalled or retrying\n")
    end = page.index("\n#", start + 5)
    rows: dict[str, str] = {}
    for line in page[start:end].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`([A-Za-z0-9]+)`", cells[0]) if line.startswith("|") else None
        if match is None:
            continue
        assert match.group(1) not in rows, f"{match.group(1)} is listed twice"
        rows[match.group(1)] = cells[2]
    return rows


def source_reasons() -> set[str]:
    return {
        cls.reason
        for name in source_errors.__all__
        if isinstance(cls := getattr(source_errors, name), type)
        and issubclass(cls, source_errors.SourceError)
        and cls is not source_errors.SourceError  # the base, never raised itself
    }


def test_every_failure_reason_is_in_the_table_with_its_verdict() -> None:
    rows = table()
    expected = {str(r) for r in STALLS | RETRIES} | source_reasons()
    assert set(rows) == expected
    for reason, verdict in rows.items():
        assert verdict == ("stalls" if stalls(reason) else "retries"), reason

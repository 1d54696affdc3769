"""The chart README's values table, built from values.yaml's ``# --`` comments.

Each documented key (a ``# -- meaning`` comment right above it, continued by ``#`` lines) is a
row: its dotted path, its default (as JSON) and its meaning; its children need no comment of
their own. ``python -m tests.unit.chart.values_doc`` rewrites the table in the README;
tests/unit/chart/test_chart_files.py fails when the README or values.yaml drift apart.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[3] / "charts" / "taskhandler-operator"
BEGIN = "<!-- values-table:begin (python -m tests.unit.chart.values_doc) -->"
END = "<!-- values-table:end -->"
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_-]+):")


def documented_keys(text: str) -> dict[str, str]:
    """Dotted path -> meaning, for every key with a ``# --`` comment above it."""
    docs: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending = [stripped[4:].strip()]
            continue
        if stripped.startswith("#") and pending is not None:
            pending.append(stripped[1:].strip())
            continue
        match = _KEY.match(line)
        if match is None:
            if stripped and not stripped.startswith(("-", "#")):
                pending = None
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match["key"]))
        if pending is not None:
            docs[".".join(key for _, key in stack)] = " ".join(pending)
        pending = None
    return docs


def _lookup(values: dict[str, Any], path: str) -> Any:
    node: Any = values
    for part in path.split("."):
        node = node[part]
    return node


def undocumented_leaves(values: Any, docs: dict[str, str], prefix: str = "") -> list[str]:
    """Leaves (and empty maps) with no documented key on their path."""
    if prefix and prefix in docs:
        return []
    if isinstance(values, dict) and values:
        found: list[str] = []
        for key, child in values.items():
            found += undocumented_leaves(child, docs, f"{prefix}.{key}" if prefix else key)
        return found
    return [prefix]


def table(values_text: str) -> str:
    values = yaml.safe_load(values_text)
    docs = documented_keys(values_text)
    rows = ["| Value | Default | Meaning |", "|---|---|---|"]
    for path, meaning in docs.items():
        default = json.dumps(_lookup(values, path), separators=(", ", ": "))
        meaning = meaning.replace("|", "\\|")
        rows.append(f"| `{path}` | `{default}` | {meaning} |")
    return "\n".join(rows)


def expected_readme(readme: str, values_text: str) -> str:
    head, _, rest = readme.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{table(values_text)}\n{END}{tail}"


def main() -> int:
    readme = CHART / "README.md"
    values_text = (CHART / "values.yaml").read_text(encoding="utf-8")
    readme.write_text(expected_readme(readme.read_text(encoding="utf-8"), values_text))
    print(f"rewrote the values table in {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

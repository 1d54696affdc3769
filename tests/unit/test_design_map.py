"""docs/design.md's package map lists every module of the package, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE = REPO_ROOT / "operator" / "taskhandler_operator"


def test_the_package_map_matches_the_modules() -> None:
    page = (REPO_ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    section = page.split("## Package map", 1)[1].split("```", 2)[1]
    listed = set(re.findall(r"^(\S+\.py)\s", section, re.M))
    modules = {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if "migrations/versions" not in path.as_posix()
    }
    assert sorted(modules - listed) == [], "modules missing from docs/design.md"
    assert sorted(listed - modules) == [], "docs/design.md lists modules that do not exist"

"""docs/design.md's package maps list every module of the operator's package and of the
development environment's, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE = REPO_ROOT / "operator" / "taskhandler_operator"
DEV_PACKAGE = REPO_ROOT / "devenv" / "taskhandler_devenv"


def _listed(heading: str) -> set[str]:
    page = (REPO_ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    section = page.split(f"\n{heading}\n", 1)[1].split("```", 2)[1]
    return set(re.findall(r"^(\S+\.py)\s", section, re.M))


@pytest.mark.parametrize(
    ("heading", "package"),
    [("## Package map", PACKAGE), ("## The development environment", DEV_PACKAGE)],
    ids=["operator", "devenv"],
)
def test_the_package_map_matches_the_modules(heading: str, package: Path) -> None:
    listed = _listed(heading)
    modules = {
        path.relative_to(package).as_posix()
        for path in package.rglob("*.py")
        if "migrations/versions" not in path.as_posix()
    }
    assert sorted(modules - listed) == [], f"modules missing from docs/design.md ({heading})"
    assert sorted(listed - modules) == [], (
        f"docs/design.md lists modules that do not exist ({heading})"
    )

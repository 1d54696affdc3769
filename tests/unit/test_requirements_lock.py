"""images/requirements.txt, the hash-locked dependencies the images install, agrees with
pyproject.toml; offline and deterministic (regenerating the lock needs the package index, so
this test reads it instead):

* every entry is pinned with `==` and carries sha256 hashes, and nothing else (no index, no
  path, no editable) is in the file;
* the entries uv marks as coming from pyproject.toml are exactly [project].dependencies, each at
  a version its specifier admits and with its extras;
* every other entry is required by a locked one, and every package named as a reason is locked
  (nothing stale, nothing dangling);
* it was written by `make requirements-lock` for the images' Python.

When it fails after a change to the dependencies: `make requirements-lock`.
"""

from __future__ import annotations

import copy
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "images" / "requirements.txt"
SCRIPT = REPO / "hack" / "lock-requirements.sh"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = f"{PYPROJECT['project']['name']} (pyproject.toml)"
FIX = "; regenerate it: make requirements-lock"


def norm(name: str) -> str:
    return str(canonicalize_name(name))


@dataclass
class Entry:
    requirement: Requirement
    hashes: list[str] = field(default_factory=list)
    via: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return norm(self.requirement.name)

    @property
    def version(self) -> str:
        [spec] = self.requirement.specifier
        return spec.version


def parse_lock(text: str) -> tuple[list[str], list[Entry]]:
    """The header comments and the entries of a `uv pip compile --generate-hashes
    --annotation-style split` file; anything but a requirement with hashes is refused."""
    header: list[str] = []
    entries: list[Entry] = []
    in_via = False
    for line in re.sub(r"\\\n", " ", text).splitlines():
        if not line.strip():
            continue
        if not entries and line.startswith("#"):
            header.append(line)
        elif not line.startswith(" "):
            requirement, *options = re.split(r"\s+(?=--)", line.strip())
            assert all(o.startswith("--hash=") for o in options), f"not a hash: {line}"
            entries.append(Entry(Requirement(requirement), [o[7:] for o in options]))
            in_via = False
        elif line.strip() == "# via":
            in_via = True
        elif line.strip().startswith("# via "):
            entries[-1].via.append(line.strip()[6:])
        elif in_via and line.strip().startswith("#   "):
            entries[-1].via.append(line.strip()[4:])
        else:
            raise AssertionError(f"unexpected line in the lock: {line!r}")
    return header, entries


def drift(pyproject: dict[str, Any], lock_text: str) -> list[str]:
    """What keeps the lock from being the one pyproject.toml's dependencies give (empty: none)."""
    problems: list[str] = []
    header, entries = parse_lock(lock_text)
    if "#    make requirements-lock" not in header:
        problems.append("the lock was not written by make requirements-lock")
    for entry in entries:
        specs = list(entry.requirement.specifier)
        if len(specs) != 1 or specs[0].operator != "==":
            problems.append(f"{entry.requirement} is not pinned with ==")
        if not entry.hashes or not all(
            re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in entry.hashes
        ):
            problems.append(f"{entry.requirement.name} has no --hash=sha256:")
        if not entry.via:
            problems.append(f"{entry.requirement.name} says nothing of why it is locked")
    locked = {e.name: e for e in entries}
    declared = {norm(r.name): r for r in map(Requirement, pyproject["project"]["dependencies"])}
    direct = {e.name for e in entries if PROJECT in e.via}
    for name in sorted(declared.keys() - direct):
        problems.append(f"{declared[name]} is declared in pyproject.toml but not locked{FIX}")
    for name in sorted(direct - declared.keys()):
        problems.append(f"{name} is locked but pyproject.toml no longer declares it{FIX}")
    for name in sorted(declared.keys() & direct):
        want, entry = declared[name], locked[name]
        if not want.specifier.contains(entry.version, prereleases=True):
            problems.append(f"{name}=={entry.version} is outside pyproject.toml's {want}{FIX}")
        if not want.extras <= entry.requirement.extras:
            problems.append(f"{name} is locked without the extras of {want}{FIX}")
    # Every reason is itself locked, and every entry is reachable from pyproject.toml.
    reasons = {norm(v.split(" ")[0]) for e in entries for v in e.via if v != PROJECT}
    for name in sorted(reasons - locked.keys()):
        problems.append(f"{name} is named as a reason but is not locked{FIX}")
    reachable, frontier = set(), set(direct)
    while frontier:
        reachable |= frontier
        frontier = {
            e.name
            for e in entries
            if e.name not in reachable and {norm(v) for v in e.via} & reachable
        }
    for name in sorted(locked.keys() - reachable):
        problems.append(f"{name} is locked but nothing declared needs it{FIX}")
    return problems


def test_the_lock_is_pyprojects_dependencies_pinned_and_hashed() -> None:
    assert drift(PYPROJECT, LOCK.read_text(encoding="utf-8")) == []


def test_the_lock_covers_the_project_and_its_extras() -> None:
    _, entries = parse_lock(LOCK.read_text(encoding="utf-8"))
    names = {e.name for e in entries}
    # The extras pyproject.toml asks for bring their packages in.
    assert {"psycopg-binary", "greenlet"} <= names
    assert all(len(e.hashes) >= 1 for e in entries) and len(entries) > 20


def with_dependencies(change: dict[str, str | None], *added: str) -> dict[str, Any]:
    """pyproject.toml with some dependencies replaced (None: removed) or added."""
    changed = copy.deepcopy(PYPROJECT)
    deps = []
    for dep in changed["project"]["dependencies"]:
        name = norm(Requirement(dep).name)
        if name not in change:
            deps.append(dep)
        elif change[name] is not None:
            deps.append(change[name])
    changed["project"]["dependencies"] = deps + list(added)
    return changed


@pytest.mark.parametrize(
    ("pyproject", "problem"),
    [
        (
            with_dependencies({}, "rich>=13"),
            "rich>=13 is declared in pyproject.toml but not locked",
        ),
        (
            with_dependencies({"msgpack": None}),
            "msgpack is locked but pyproject.toml no longer declares it",
        ),
        (
            with_dependencies({"kopf": "kopf>=1.46,<1.47"}),
            "is outside pyproject.toml's kopf<1.47,>=1.46",
        ),
        (
            with_dependencies({"kopf": "kopf[uvloop]>=1.45,<1.46"}),
            "kopf is locked without the extras of kopf[uvloop]",
        ),
    ],
    ids=["added", "removed", "new-range", "new-extra"],
)
def test_a_changed_pyproject_is_drift(pyproject: dict[str, Any], problem: str) -> None:
    problems = drift(pyproject, LOCK.read_text(encoding="utf-8"))
    assert len(problems) == 1 and problem in problems[0], problems
    assert problems[0].endswith(FIX)


def test_an_unhashed_or_unpinned_or_stale_entry_is_drift() -> None:
    text = LOCK.read_text(encoding="utf-8")
    first = re.search(r"^msgpack==\S+ \\\n(    --hash=\S+ \\\n)*    --hash=\S+\n", text, re.M)
    assert first
    unhashed = text.replace(first[0], first[0].split(" \\\n")[0] + "\n")
    assert drift(PYPROJECT, unhashed) == ["msgpack has no --hash=sha256:"]
    version = first[0].split("==")[1].split(" ")[0]
    unpinned = text.replace("\nmsgpack==", "\nmsgpack>=", 1)
    assert drift(PYPROJECT, unpinned) == [f"msgpack>={version} is not pinned with =="]
    stale = text + "leftover==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n    # via nothing\n"
    assert drift(PYPROJECT, stale) == [
        f"nothing is named as a reason but is not locked{FIX}",
        f"leftover is locked but nothing declared needs it{FIX}",
    ]
    with pytest.raises(AssertionError, match="not a hash"):
        parse_lock(text + "other==1 --index-url https://example.invalid/simple\n")
    with pytest.raises(AssertionError, match="unexpected line"):
        parse_lock(text + "    -e ./somewhere\n")


def test_the_lock_is_for_the_images_python() -> None:
    script = shlex.split(re.sub(r"\\\n", " ", SCRIPT.read_text(encoding="utf-8")))
    assert {"--generate-hashes", "--universal", "--no-strip-extras"} <= set(script)
    python = script[script.index("--python-version") + 1]
    dockerfile = (REPO / "images" / "Dockerfile").read_text(encoding="utf-8")
    image = re.search(r"^ARG PYTHON_IMAGE=python:(\d+\.\d+)-", dockerfile, re.M)
    assert image and image[1] == python
    assert Requirement(f"x{PYPROJECT['project']['requires-python']}").specifier.contains(python)
    assert script[script.index("--output-file") + 1] == "images/requirements.txt"
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert re.search(
        r"^requirements-lock: venv\n\t.*bash hack/lock-requirements.sh$", makefile, re.M
    )

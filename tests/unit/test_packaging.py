"""The shipped package is the operator alone (issue 22): the development environment
(``devenv/``, package ``taskhandler_devenv``: the test control plane, its process node, the
throwaway servers, the demo's data) is neither in the operator's wheel nor in its images, and
the operator never imports it."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEV_PACKAGE = "taskhandler_devenv"
DOCKERFILES = sorted((REPO / "images").glob("**/Dockerfile"))


def _checkout_copy(dest: Path) -> Path:
    """The checkout's files as git sees them (tracked, plus new ones not ignored), so the wheel is
    built from what a clean clone holds and the build's leftovers stay out of the checkout."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the work tree is listed too
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def test_the_operator_wheel_holds_the_operator_alone(tmp_path: Path) -> None:
    source = _checkout_copy(tmp_path / "checkout")
    assert (source / "devenv" / DEV_PACKAGE / "__init__.py").is_file(), "the copy has the devenv"
    out = tmp_path / "wheels"
    # No build isolation: the venv's pinned setuptools builds it, without network.
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"]
    subprocess.run(
        [*pip_wheel, "--no-build-isolation", "--no-index", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    [wheel] = out.glob("*.whl")
    assert wheel.name.startswith("taskhandler_operator-")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = archive.read(entry_points).decode()
    tops = {name.split("/", 1)[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"taskhandler_operator"}
    for module in ("__init__.py", "cli.py", "py.typed", "db/migrations/env.py", "kube/crd.py"):
        assert f"taskhandler_operator/{module}" in names, module
    assert any(n.startswith("taskhandler_operator/db/migrations/versions/") for n in names)
    devenv = [n for n in names if "devenv" in n or "kubecluster" in n]
    assert devenv == [], "the development environment is not shipped"
    assert "taskhandler-operator = taskhandler_operator.cli:console_main" in scripts


def _context_copies(dockerfile: Path) -> list[str]:
    """The build-context paths a Dockerfile's COPY/ADD instructions take (not --from stages)."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text(encoding="utf-8"))
    sources: list[str] = []
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word.upper() in ("COPY", "ADD"):
            args = [a for a in shlex.split(rest) if not a.startswith("--")]
            if "--from=" not in rest:
                sources += args[:-1]
    return sources


def test_no_image_copies_the_development_environment() -> None:
    assert DOCKERFILES, "images/**/Dockerfile"
    for dockerfile in DOCKERFILES:
        sources = [s.strip("/") for s in _context_copies(dockerfile)]
        assert sources, dockerfile
        assert "operator" in sources, f"{dockerfile}: the image installs the operator's package"
        for src in sources:
            assert src not in ("", ".", "*"), f"{dockerfile} copies the whole build context"
            assert not src.startswith("devenv"), f"{dockerfile} copies {src}"
    # And the build context never holds it, whatever a later COPY takes: either it is ignored,
    # or the file is an allowlist (everything ignored first) that never lets it back in.
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    allowlist = patterns[0] == "*"
    readmitted = [p for p in patterns if p.startswith("!") and p[1:].strip("/").startswith("dev")]
    assert "devenv" in patterns or (allowlist and not readmitted), patterns


def test_the_operator_package_holds_no_development_environment() -> None:
    package = REPO / "operator" / "taskhandler_operator"
    assert not (package / "devenv").exists()
    assert not list(package.rglob("kubecluster"))
    assert [p.name for p in (REPO / "operator").iterdir() if p.suffix != ".egg-info"] == [
        "taskhandler_operator"
    ]


def test_an_import_contract_keeps_the_operator_from_the_development_environment() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    linter = config["tool"]["importlinter"]
    assert DEV_PACKAGE in linter["root_packages"], "import-linter must see the dev package"
    assert any(
        contract["type"] == "forbidden"
        and contract["source_modules"] == ["taskhandler_operator"]
        and contract["forbidden_modules"] == [DEV_PACKAGE]
        for contract in linter["contracts"]
    )
    find = config["tool"]["setuptools"]["packages"]["find"]
    assert find["where"] == ["operator"]
    dev = tomllib.loads((REPO / "devenv" / "pyproject.toml").read_text(encoding="utf-8"))
    assert dev["tool"]["setuptools"]["packages"]["find"]["include"] == [f"{DEV_PACKAGE}*"]

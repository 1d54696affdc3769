"""Shared helpers for the source tests: a store per test, sync shorthand, tree fingerprints."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from taskhandler_operator.sources.access import VolumeAccess
from taskhandler_operator.sources.models import Revision
from taskhandler_operator.sources.spec import SourceSpec
from taskhandler_operator.sources.store import RevisionStore
from taskhandler_operator.sources.sync import sync
from taskhandler_operator.sources.tree import TreeLimits

NAMESPACE = "team-a"


@pytest.fixture
def store(tmp_path: Path) -> RevisionStore:
    return RevisionStore(tmp_path / "store")


def make_store(root: Path, **limits: int) -> RevisionStore:
    return RevisionStore(root, limits=TreeLimits(**limits) if limits else None)


async def sync_source(
    store: RevisionStore,
    source: Mapping[str, Any],
    credentials: Mapping[str, bytes] | None = None,
    *,
    bundle: str = "bundle",
    within: float = 60.0,
) -> Revision:
    # The tests' volume folders sit next to the store, in the test's tmp_path.
    volumes = VolumeAccess.for_operator([store.root.parent], store=store.root)
    return await sync(
        SourceSpec.model_validate(source),
        credentials,
        store,
        namespace=NAMESPACE,
        bundle=bundle,
        timeout=within,
        volumes=volumes,
    )


def fingerprint(root: Path) -> dict[str, tuple[int, int, int, int]]:
    """Every entry under ``root`` with (inode, size, mtime_ns, ctime_ns): equal means untouched."""
    found: dict[str, tuple[int, int, int, int]] = {}
    if not root.exists():
        return found
    for directory, folders, files in os.walk(root):
        for name in [*folders, *files]:
            path = Path(directory) / name
            st = path.lstat()
            found[str(path.relative_to(root))] = (
                st.st_ino,
                st.st_size,
                st.st_mtime_ns,
                st.st_ctime_ns,
            )
    return found


def read_tree(root: Path) -> dict[str, bytes]:
    """Relative path -> content of every regular file under ``root`` (symlinks as targets)."""
    found: dict[str, bytes] = {}
    for directory, _folders, files in os.walk(root):
        for name in files:
            path = Path(directory) / name
            rel = str(path.relative_to(root))
            found[rel] = (
                b"-> " + str(path.readlink()).encode() if path.is_symlink() else path.read_bytes()
            )
    return found

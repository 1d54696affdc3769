"""The three images built once per session (cached by content across sessions)."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskhandler_devenv.images import app_version, build_images, image_ref
from taskhandler_devenv.images.buildkit import bins_dir
from taskhandler_devenv.images.oci import Archive, read_archive

REPO = Path(__file__).resolve().parents[3]
TARGETS = ("operator", "probe-java", "probe-node")


@pytest.fixture(scope="session")
def built_images() -> dict[str, Path]:
    return build_images()


@pytest.fixture(scope="session")
def archives(built_images: dict[str, Path]) -> dict[str, Archive]:
    """Target name -> the archive read back."""
    version = app_version()
    return {t: read_archive(built_images[image_ref(t, version)]) for t in TARGETS}


@pytest.fixture(scope="session")
def runc() -> Path:
    path = bins_dir(REPO) / "runc"
    assert path.is_file(), "build_images() builds BuildKit's runc"
    return path


@pytest.fixture(scope="session")
def rootfs(
    archives: dict[str, Archive], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """Each image's layers unpacked (root-owned, as a node's snapshotter has them)."""
    out = {}
    for target, archive in archives.items():
        dest = tmp_path_factory.mktemp(f"rootfs-{target}")
        archive.extract_rootfs(dest)
        out[target] = dest
    return out

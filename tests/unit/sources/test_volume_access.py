"""Where a volume source may read (sources/access.py): the pure rule, then the open on a real
file system (symlinks resolved before the check, a symlink swapped in after it refused)."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import pytest

from taskhandler_operator.sources.access import (
    ALWAYS_PROTECTED,
    VolumeAccess,
    VolumeNotAllowed,
    check_volume_path,
)
from taskhandler_operator.sources.git import credentials_dir

P = PurePosixPath
STORE = P("/var/lib/taskhandler-operator/revisions")


def refused(path: str, roots: list[str], protected: list[PurePosixPath] | None = None) -> str:
    with pytest.raises(VolumeNotAllowed) as info:
        check_volume_path(P(path), [P(r) for r in roots], protected or [STORE, *ALWAYS_PROTECTED])
    assert info.value.reason == "VolumeNotAllowed" and info.value.permanent
    return info.value.message


def test_a_path_below_an_allowed_root_is_read() -> None:
    roots = [P("/bundles"), P("/mnt/shared")]
    assert check_volume_path(P("/bundles/team-a"), roots, [STORE]) == P("/bundles")
    assert check_volume_path(P("/mnt/shared"), roots, [STORE]) == P("/mnt/shared")


def test_no_roots_refuses_every_volume_source_and_says_how_to_allow() -> None:
    message = refused("/bundles/team-a", [])
    assert "allows no volume sources" in message and "THOP_VOLUME_ROOTS" in message


def test_a_path_outside_the_roots_is_refused_naming_them() -> None:
    message = refused("/etc", ["/bundles", "/data"])
    assert "outside the folders" in message and "/bundles, /data" in message
    # A name that only starts like a root is not below it.
    refused("/bundles-other/x", ["/bundles"])


@pytest.mark.parametrize(
    "path",
    [
        "/var/lib/taskhandler-operator/revisions/other-team/bundle/abc",  # another tenant
        "/var/lib/taskhandler-operator/revisions",
        "/var/lib/taskhandler-operator",  # holds the store
        "/",
        "/proc/self",
        "/proc",
        "/var/run/secrets/kubernetes.io/serviceaccount",
        "/run/secrets",
        "/sys/kernel",
        "/dev",
    ],
)
def test_protected_folders_are_refused_even_below_an_allowed_root(path: str) -> None:
    assert "overlaps" in refused(path, ["/"])


def test_relative_or_unnormalised_paths_are_refused() -> None:
    refused("bundles", ["/"])
    refused("/bundles/../etc", ["/bundles"])


def test_the_message_names_what_the_spec_wrote_and_what_it_resolves_to() -> None:
    with pytest.raises(VolumeNotAllowed) as info:
        check_volume_path(P("/etc"), [P("/bundles")], [], shown="/bundles/link")
    assert "/bundles/link (resolves to /etc)" in info.value.message


def test_operator_policy_protects_the_store_and_the_secret_folders(tmp_path: Path) -> None:
    access = VolumeAccess.for_operator(
        [tmp_path],
        store=tmp_path / "store",
        secret_files=(tmp_path / "db" / "url", None, Path("/key")),
    )
    protected = access.resolved_protected()
    assert P(tmp_path / "store") in protected and P(tmp_path / "db") in protected
    assert P("/") not in protected  # a Secret file at the root must not refuse everything
    assert P("/proc") in protected
    assert P(os.path.realpath(credentials_dir())) in protected  # git's credential files


# --- on the file system ----------------------------------------------------------------------


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    (tmp_path / "allowed" / "team-a" / "bundle").mkdir(parents=True)
    (tmp_path / "allowed" / "team-a" / "bundle" / "a.txt").write_text("a")
    (tmp_path / "store" / "team-b" / "secret-bundle").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    return tmp_path


def access_of(layout: Path) -> VolumeAccess:
    return VolumeAccess.for_operator([layout / "allowed"], store=layout / "store")


def test_open_folder_returns_the_folder_below_the_root(layout: Path) -> None:
    fd = access_of(layout).open_folder(str(layout / "allowed" / "team-a" / "bundle"))
    try:
        assert os.listdir(fd) == ["a.txt"]  # noqa: PTH208 - a descriptor
    finally:
        os.close(fd)


def test_a_symlink_out_of_the_root_is_resolved_before_the_check(layout: Path) -> None:
    (layout / "allowed" / "to-store").symlink_to(layout / "store" / "team-b")
    (layout / "allowed" / "to-proc").symlink_to("/proc/self")
    access = access_of(layout)
    with pytest.raises(VolumeNotAllowed, match="overlaps"):
        access.open_folder(str(layout / "allowed" / "to-store" / "secret-bundle"))
    with pytest.raises(VolumeNotAllowed, match="overlaps /proc"):
        access.open_folder(str(layout / "allowed" / "to-proc"))
    (layout / "allowed" / "away").symlink_to(layout / "outside")
    with pytest.raises(VolumeNotAllowed, match="resolves to"):
        access.open_folder(str(layout / "allowed" / "away"))


def test_a_symlink_inside_the_root_is_followed(layout: Path) -> None:
    (layout / "allowed" / "current").symlink_to("team-a/bundle")
    fd = access_of(layout).open_folder(str(layout / "allowed" / "current"))
    try:
        assert os.listdir(fd) == ["a.txt"]  # noqa: PTH208 - a descriptor
    finally:
        os.close(fd)


def test_a_root_that_is_a_symlink_works(layout: Path) -> None:
    (layout / "mount").symlink_to(layout / "allowed")
    access = VolumeAccess.for_operator([layout / "mount"], store=layout / "store")
    fd = access.open_folder(str(layout / "mount" / "team-a"))
    os.close(fd)


def test_a_folder_swapped_for_a_symlink_after_the_check_is_refused(
    layout: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race: the path resolves inside the root, then a writer of the volume replaces a
    folder on it with a symlink to the store before the open."""
    access = access_of(layout)
    team = layout / "allowed" / "team-a"
    real_check = VolumeAccess.check

    def check_then_swap(self: VolumeAccess, path: str) -> tuple[PurePosixPath, PurePosixPath]:
        found = real_check(self, path)
        team.rename(layout / "allowed" / "moved")
        team.symlink_to(layout / "store" / "team-b")
        return found

    monkeypatch.setattr(VolumeAccess, "check", check_then_swap)
    with pytest.raises(VolumeNotAllowed, match="became a symlink"):
        access.open_folder(str(team / "bundle"))


def test_a_missing_folder_is_the_open_error(layout: Path) -> None:
    with pytest.raises(FileNotFoundError):
        access_of(layout).open_folder(str(layout / "allowed" / "nope"))

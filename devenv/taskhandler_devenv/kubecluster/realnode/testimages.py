"""Small local images for the real node: the pause (sandbox) image from the built ``pause``
binary, and a busybox image from Debian's static busybox (``busybox-static``)."""

from __future__ import annotations

import shutil
from pathlib import Path

from .ociarchive import ImageConfig, write_oci_archive

PAUSE_REF = "localhost/thop-pause:v1"
BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "cat", "echo", "grep", "id", "ls", "sleep", "touch", "test", "dd", "head")


def pause_archive(pause_binary: Path, workdir: Path) -> Path:
    rootfs = workdir / "pause-rootfs"
    rootfs.mkdir(parents=True, exist_ok=True)
    shutil.copy2(pause_binary, rootfs / "pause")
    config = ImageConfig(entrypoint=["/pause"], user="65535:65535", env=[])
    return write_oci_archive(rootfs, PAUSE_REF, workdir / "pause.oci.tar", config)


def busybox_archive(
    workdir: Path, ref: str, user: str = "", extra: dict[str, Path] | None = None
) -> Path:
    """A busybox image named ``ref`` running as ``user`` ("" = root); ``extra`` maps paths in
    the image to host files copied in (a static test binary)."""
    rootfs = workdir / f"rootfs-{ref.replace('/', '_').replace(':', '_')}"
    shutil.rmtree(rootfs, ignore_errors=True)
    (rootfs / "bin").mkdir(parents=True)
    (rootfs / "tmp").mkdir(mode=0o1777)
    (rootfs / "tmp").chmod(0o1777)
    shutil.copy2(BUSYBOX, rootfs / "bin" / "busybox")
    for applet in APPLETS:
        (rootfs / "bin" / applet).symlink_to("busybox")
    for inside, source in (extra or {}).items():
        target = rootfs / inside.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    config = ImageConfig(cmd=["sh"], user=user)
    return write_oci_archive(rootfs, ref, workdir / f"{rootfs.name}.oci.tar", config)

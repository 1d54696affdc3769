"""OCI image layouts: written from layer tars (the local base images), read from archives.

The writer makes what BuildKit's ``oci-layout://`` named contexts read (``oci-layout`` file,
``index.json``, blobs by digest); the reader takes apart the OCI archive ``buildctl`` writes, for
the image tests and for checking the containerd name annotation.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
# What `ctr images import` names an image by (containerd's images.AnnotationImageName).
IMAGE_NAME_ANNOTATION = "io.containerd.image.name"
REF_NAME_ANNOTATION = "org.opencontainers.image.ref.name"


class OciError(RuntimeError):
    """An OCI layout or archive is not what the image build needs."""


@dataclass(frozen=True)
class ImageConfig:
    """The runtime part of an image config (what ``docker inspect`` calls Config)."""

    env: Sequence[str] = ()
    cmd: Sequence[str] = ()
    entrypoint: Sequence[str] = ()
    working_dir: str = ""
    user: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _put_blob(layout: Path, data: bytes) -> str:
    digest = _digest(data)
    path = layout / "blobs" / "sha256" / digest.removeprefix("sha256:")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return digest


def _gzip_layer(layout: Path, layer_tar: Path) -> tuple[str, str, int]:
    """Compress one layer tar into the layout: (blob digest, diff id, blob size)."""
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    tmp = blobs / ".layer.partial"
    raw = hashlib.sha256()
    # mtime=0: the same layer tar always gives the same blob, so the digest is a cache key.
    with layer_tar.open("rb") as src, gzip.GzipFile(tmp, mode="wb", compresslevel=6, mtime=0) as gz:
        while chunk := src.read(1 << 20):
            raw.update(chunk)
            gz.write(chunk)
    packed = hashlib.sha256()
    with tmp.open("rb") as blob:
        while chunk := blob.read(1 << 20):
            packed.update(chunk)
    target = blobs / packed.hexdigest()
    tmp.rename(target)
    return "sha256:" + packed.hexdigest(), "sha256:" + raw.hexdigest(), target.stat().st_size


def write_layout(layout: Path, layer_tars: Sequence[Path], config: ImageConfig, ref: str) -> str:
    """Write an OCI image layout of the layers (bottom first); returns the manifest digest.

    ``ref`` is recorded as the index entry's ``org.opencontainers.image.ref.name``.
    """
    if layout.exists():
        shutil.rmtree(layout)
    layout.mkdir(parents=True)
    layers: list[dict[str, Any]] = []
    diff_ids: list[str] = []
    for tar in layer_tars:
        digest, diff_id, size = _gzip_layer(layout, tar)
        layers.append({"mediaType": LAYER_TYPE, "digest": digest, "size": size})
        diff_ids.append(diff_id)
    run: dict[str, Any] = {"Env": list(config.env)}
    if config.cmd:
        run["Cmd"] = list(config.cmd)
    if config.entrypoint:
        run["Entrypoint"] = list(config.entrypoint)
    if config.working_dir:
        run["WorkingDir"] = config.working_dir
    if config.user:
        run["User"] = config.user
    if config.labels:
        run["Labels"] = dict(config.labels)
    config_blob = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": run,
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
            "history": [{"created_by": f"taskhandler_devenv.images: {ref}"} for _ in diff_ids],
        },
        sort_keys=True,
    ).encode()
    config_digest = _put_blob(layout, config_blob)
    manifest_blob = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "digest": config_digest, "size": len(config_blob)},
            "layers": layers,
        },
        sort_keys=True,
    ).encode()
    manifest_digest = _put_blob(layout, manifest_blob)
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": MANIFEST_TYPE,
                "digest": manifest_digest,
                "size": len(manifest_blob),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {REF_NAME_ANNOTATION: ref},
            }
        ],
    }
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    (layout / "index.json").write_text(json.dumps(index, sort_keys=True))
    return manifest_digest


@dataclass(frozen=True)
class Archive:
    """One image read from an OCI archive: its index entry, config and layer tars."""

    path: Path
    index_annotations: Mapping[str, str]
    config: Mapping[str, Any]
    layer_digests: Sequence[str]

    @property
    def runtime(self) -> Mapping[str, Any]:
        """The config's ``config`` object (User, Entrypoint, Cmd, Env, Labels)."""
        value = self.config.get("config") or {}
        assert isinstance(value, dict)
        return value

    def _member(self, digest: str) -> bytes:
        with tarfile.open(self.path) as tar:
            handle = tar.extractfile("blobs/sha256/" + digest.removeprefix("sha256:"))
            if handle is None:
                raise OciError(f"{self.path}: blob {digest} missing")
            return handle.read()

    def files(self) -> dict[str, tarfile.TarInfo]:
        """Every path of the image's root file system after applying the layers (whiteouts too)."""
        tree: dict[str, tarfile.TarInfo] = {}
        for digest in self.layer_digests:
            with tarfile.open(fileobj=io.BytesIO(self._member(digest)), mode="r:*") as layer:
                for info in layer.getmembers():
                    name = info.name.removeprefix("./").rstrip("/")
                    base = name.rsplit("/", 1)[-1]
                    parent = name.rsplit("/", 1)[0] if "/" in name else ""
                    if base == ".wh..wh..opq":
                        for key in [k for k in tree if k.startswith(parent + "/")]:
                            del tree[key]
                    elif base.startswith(".wh."):
                        gone = (parent + "/" if parent else "") + base.removeprefix(".wh.")
                        for key in [k for k in tree if k == gone or k.startswith(gone + "/")]:
                            del tree[key]
                    elif name:
                        tree[name] = info
        return tree

    def extract_rootfs(self, dest: Path) -> None:
        """Unpack the layers into ``dest`` (for running the image with runc)."""
        dest.mkdir(parents=True, exist_ok=True)
        for digest in self.layer_digests:
            with tarfile.open(fileobj=io.BytesIO(self._member(digest)), mode="r:*") as layer:
                for info in layer.getmembers():
                    name = info.name.removeprefix("./").rstrip("/")
                    base = name.rsplit("/", 1)[-1]
                    parent = dest / name.rsplit("/", 1)[0] if "/" in name else dest
                    if base == ".wh..wh..opq":
                        for child in parent.iterdir():
                            _remove(child)
                    elif base.startswith(".wh."):
                        _remove(parent / base.removeprefix(".wh."))
                    else:
                        target = dest / name
                        if target.is_symlink() or (target.exists() and not target.is_dir()):
                            target.unlink()
                        layer.extract(info, dest, numeric_owner=True, filter="fully_trusted")


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def read_archive(path: Path) -> Archive:
    """Read the single image of an OCI archive (a tar of an OCI layout)."""
    with tarfile.open(path) as tar:

        def blob(digest: str) -> dict[str, Any]:
            handle = tar.extractfile("blobs/sha256/" + digest.removeprefix("sha256:"))
            if handle is None:
                raise OciError(f"{path}: blob {digest} missing")
            value = json.loads(handle.read())
            assert isinstance(value, dict)
            return value

        handle = tar.extractfile("index.json")
        if handle is None:
            raise OciError(f"{path}: no index.json")
        index = json.loads(handle.read())
        entries = index.get("manifests") or []
        if len(entries) != 1:
            raise OciError(f"{path}: expected one image in index.json, found {len(entries)}")
        entry = entries[0]
        manifest = blob(entry["digest"])
        if manifest.get("mediaType") != MANIFEST_TYPE and "manifests" in manifest:
            # An image index (attestations or several platforms): take the amd64 image.
            picked = [
                m
                for m in manifest["manifests"]
                if (m.get("platform") or {}).get("architecture") == "amd64"
            ]
            if not picked:
                raise OciError(f"{path}: no linux/amd64 image in the index")
            manifest = blob(picked[0]["digest"])
        config = blob(manifest["config"]["digest"])
        return Archive(
            path=path,
            index_annotations=dict(entry.get("annotations") or {}),
            config=config,
            layer_digests=[layer["digest"] for layer in manifest["layers"]],
        )

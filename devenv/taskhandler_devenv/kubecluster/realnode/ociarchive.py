"""Write an OCI image archive from a root file system folder, without a registry or a builder.

The archive is an OCI image layout in a tar (``oci-layout``, ``index.json``, ``blobs/sha256``):
one gzip layer of the folder, an image config, a manifest, and an index whose manifest entry
carries ``io.containerd.image.name`` so ``ctr images import --local`` names the image. Layer
entries are owned by root with a fixed mtime, so the same folder gives the same digests.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
INDEX = "application/vnd.oci.image.index.v1+json"
NAME_ANNOTATION = "io.containerd.image.name"


@dataclass(frozen=True)
class ImageConfig:
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    user: str = ""
    env: list[str] = field(default_factory=lambda: ["PATH=/bin:/usr/bin"])
    workdir: str = "/"


def _normalize(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info


def _layer(rootfs: Path, scratch: Path) -> tuple[Path, str, str]:
    """(gzip layer path, its sha256, the uncompressed tar's sha256 = the diff id)."""
    plain = scratch / "layer.tar"
    with tarfile.open(plain, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(rootfs.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(rootfs)), recursive=False, filter=_normalize)
    diff_id = _sha256_file(plain)
    packed = scratch / "layer.tar.gz"
    with (
        plain.open("rb") as src,
        packed.open("wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as dst,
    ):
        shutil.copyfileobj(src, dst)
    return packed, _sha256_file(packed), diff_id


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = _normalize(tarfile.TarInfo(name))
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _descriptor(media_type: str, data: bytes) -> dict[str, Any]:
    return {
        "mediaType": media_type,
        "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
        "size": len(data),
    }


def write_oci_archive(rootfs: Path, ref: str, out: Path, config: ImageConfig) -> Path:
    """Write ``out`` (an OCI layout tar) holding one image named ``ref`` built from ``rootfs``."""
    with tempfile.TemporaryDirectory(prefix="thop-oci-") as tmp:
        layer, layer_digest, diff_id = _layer(rootfs, Path(tmp))
        image_config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Entrypoint": config.entrypoint or None,
                "Cmd": config.cmd or None,
                "User": config.user,
                "Env": config.env,
                "WorkingDir": config.workdir,
            },
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        }
        config_bytes = json.dumps(image_config, sort_keys=True).encode()
        layer_desc = {
            "mediaType": LAYER,
            "digest": f"sha256:{layer_digest}",
            "size": layer.stat().st_size,
        }
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": _descriptor(CONFIG, config_bytes),
            "layers": [layer_desc],
        }
        manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
        entry = _descriptor(MANIFEST, manifest_bytes)
        entry["platform"] = {"architecture": "amd64", "os": "linux"}
        entry["annotations"] = {
            NAME_ANNOTATION: ref,
            "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[-1],
        }
        index = {"schemaVersion": 2, "mediaType": INDEX, "manifests": [entry]}
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(f".{out.name}.partial")
        with tarfile.open(partial, "w") as tar:
            _add_bytes(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
            _add_bytes(tar, "index.json", json.dumps(index, sort_keys=True).encode())
            blobs = "blobs/sha256/"
            _add_bytes(tar, blobs + _hex(config_bytes), config_bytes)
            _add_bytes(tar, blobs + _hex(manifest_bytes), manifest_bytes)
            tar.add(layer, arcname=blobs + layer_digest, filter=_normalize)
        partial.replace(out)
    return out


def _hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()

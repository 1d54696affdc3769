"""Local stand-ins for the three digest-pinned ``FROM`` images of images/Dockerfile.

No image registry is reachable here, so each base is made from Debian packages (``mmdebstrap``,
bookworm, from deb.debian.org) or from the machine, written as an OCI image layout and cached
under ``$THOP_CACHE/images/bases/<name>-<recipe hash>``: a changed recipe is a new folder, an
unchanged one is never rebuilt. What stands in for what, and why (docs/images.md, "Images
without a registry"):

- ``python``: bookworm's python3.11 (the project's Python; trixie's python3 is 3.13) made to
  behave like ``python:3.11-slim-trixie`` for what the Dockerfile runs: ``python``/``pip`` in
  /usr/local/bin, pip, setuptools and wheel installed by pip (pinned, hash-checked wheels from
  PyPI) so that ``pip uninstall`` can remove them, and no EXTERNALLY-MANAGED marker (the
  official image has none).
- ``jre``: Debian's openjdk-17-jre-headless copied, symlinks dereferenced, to /opt/java/openjdk
  (the Temurin image's layout; Temurin 21 is not packaged by Debian).
- ``node``: the machine's own node binary at /usr/local/bin/node (the official build, which needs
  only glibc, libstdc++6 and libgcc-s1; the python base has both through apt).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from taskhandler_devenv.images.oci import ImageConfig, write_layout

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# pip, setuptools and wheel for the python base, the versions python:3.11-slim-trixie carries
# (docker-library/python: ensurepip's pip for 3.11, `setuptools==65.5.1`, `wheel<0.46`), from
# the package index, checked against these hashes. Faithful on purpose: a newer setuptools here
# hid that the Dockerfile's build stage could not build the project with the image's own.
PYTHON_TOOL_WHEELS: tuple[tuple[str, str], ...] = (
    ("pip==24.0", "ba0d021a166865d2265246961bec0152ff124de910c5cc39f1156ce3fa7c69dc"),
    ("setuptools==65.5.1", "d0b9a8433464d5800cbe05094acf5c6d52a91bfac9b52bcfc4d41382be5d5d31"),
    ("wheel==0.45.1", "708e7481cc80179af0e556bbf0cc00b8444c7321e2700b8d8580231d13017248"),
)

JVM_DIR = "usr/lib/jvm/java-17-openjdk-amd64"
# The machine's trust store. Where HTTPS goes through a TLS-inspecting proxy (as on this
# project's CI machines) its CA is only there, and the Dockerfile's `pip install` RUN step
# would fail certificate checks; the python base trusts it too. These images are local test
# images; the registry's base images carry Debian's store alone.
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


class BaseImageError(RuntimeError):
    """A base image could not be made (mmdebstrap, a download, the machine's node)."""


@dataclass(frozen=True)
class BaseRecipe:
    """How one base image is made; everything in it goes into the cache key."""

    name: str
    # The Dockerfile ARG this base stands in for.
    arg: str
    packages: Sequence[str] = ()
    config: ImageConfig = field(default_factory=ImageConfig)
    # Paths (relative to the root) that make up the image; empty = the whole root file system.
    keep: Sequence[str] = ()
    # Shell hooks mmdebstrap runs on the finished root ("$1"), before it is packed.
    hooks: Sequence[str] = ()
    # Host files copied in (absolute host path, path in the image); hashed by content.
    host_files: Sequence[tuple[str, str]] = ()
    # Add the machine's CA bundle to the image's trust store (see HOST_CA_BUNDLE).
    host_ca: bool = False

    def key(self) -> str:
        h = hashlib.sha256()
        h.update(
            json.dumps(
                {
                    "name": self.name,
                    "suite": SUITE,
                    "packages": list(self.packages),
                    "config": [
                        list(self.config.env),
                        list(self.config.cmd),
                        self.config.working_dir,
                    ],
                    "keep": list(self.keep),
                    "hooks": list(self.hooks),
                    "wheels": PYTHON_TOOL_WHEELS if self.name == "python" else [],
                    "host": [dst for _, dst in self.host_files],
                },
                sort_keys=True,
            ).encode()
        )
        for src, _ in self.host_files:
            h.update(hashlib.sha256(Path(src).read_bytes()).digest())
        if self.host_ca and Path(HOST_CA_BUNDLE).is_file():
            h.update(hashlib.sha256(Path(HOST_CA_BUNDLE).read_bytes()).digest())
        return h.hexdigest()[:16]

    @property
    def ref(self) -> str:
        return f"localhost/thop-base-{self.name}:{self.key()}"


_PYTHON_HOOKS = (
    # pip from PyPI checks certificates against its own bundle (certifi), not the system's:
    # point it at the system's, which now holds the machine's CA.
    'if [ -n "${THOP_HOST_CA:-}" ]; then cp "$THOP_HOST_CA"'
    ' "$1"/usr/local/share/ca-certificates/thop-host-bundle.crt'
    ' && chroot "$1" update-ca-certificates >/dev/null'
    " && printf '[global]\\ncert = /etc/ssl/certs/ca-certificates.crt\\n'"
    ' > "$1"/etc/pip.conf; fi',
    # The official image has no EXTERNALLY-MANAGED marker; with it pip refuses to touch the system.
    'rm -f "$1"/usr/lib/python3.11/EXTERNALLY-MANAGED',
    'ln -sf /usr/bin/python3.11 "$1"/usr/local/bin/python',
    'ln -sf /usr/bin/python3.11 "$1"/usr/local/bin/python3',
    # pip, setuptools and wheel installed by pip into /usr/local (Debian's posix_local scheme),
    # as the official image installs them, so that the Dockerfile's `pip uninstall` can remove them.
    'mkdir -p "$1"/tmp/thop-wheels && cp "$THOP_WHEELS"/*.whl "$1"/tmp/thop-wheels/',
    # pip runs from its own wheel (a zip on sys.path) to install itself and the others.
    'chroot "$1" sh -c "python3.11 /tmp/thop-wheels/'
    + PYTHON_TOOL_WHEELS[0][0].replace("==", "-")
    + "-py3-none-any.whl/pip install --no-index --no-deps --no-compile"
    ' --disable-pip-version-check --root-user-action=ignore /tmp/thop-wheels/*.whl"',
    'rm -rf "$1"/tmp/thop-wheels "$1"/root/.cache',
)

PYTHON = BaseRecipe(
    name="python",
    arg="PYTHON_IMAGE",
    # python3.11-venv: `python -m venv` with ensurepip. ca-certificates, netbase and tzdata are
    # in the official slim image; libstdc++6 and libgcc-s1 (there through apt too) are what the
    # node binary probe-node copies in links against.
    packages=(
        "python3.11",
        "python3.11-venv",
        "ca-certificates",
        "netbase",
        "tzdata",
        "libstdc++6",
        "libgcc-s1",
    ),
    config=ImageConfig(env=(PATH_ENV, "LANG=C.UTF-8"), cmd=("python3",)),
    hooks=_PYTHON_HOOKS,
    host_ca=True,
)

JRE = BaseRecipe(
    name="jre",
    arg="JRE_IMAGE",
    packages=("openjdk-17-jre-headless",),
    config=ImageConfig(
        env=(
            PATH_ENV.replace("PATH=", "PATH=/opt/java/openjdk/bin:"),
            "JAVA_HOME=/opt/java/openjdk",
        ),
        cmd=("java", "-version"),
    ),
    keep=("opt/java/openjdk",),
    # -L: Debian's JRE links its conf files and cacerts to /etc; the Dockerfile copies only
    # /opt/java/openjdk, which must therefore hold the files themselves.
    hooks=(f'mkdir -p "$1"/opt/java && cp -rL "$1"/{JVM_DIR} "$1"/opt/java/openjdk',),
)


def node_recipe(node: str | None = None) -> BaseRecipe:
    """The node base: the machine's node binary (what `node` resolves to on PATH)."""
    path = node or shutil.which("node")
    if path is None:
        raise BaseImageError("node is not on PATH (make system-deps)")
    return BaseRecipe(
        name="node",
        arg="NODE_IMAGE",
        config=ImageConfig(env=(PATH_ENV,), cmd=("node",)),
        host_files=((os.path.realpath(path), "usr/local/bin/node"),),
    )


def recipes() -> tuple[BaseRecipe, ...]:
    return (PYTHON, JRE, node_recipe())


def _fetch_wheels(dest: Path) -> None:
    """Download the pinned wheels with pip itself (the configured index, hashes required)."""
    req = dest / "requirements.txt"
    req.write_text("".join(f"{pin} --hash=sha256:{sha}\n" for pin, sha in PYTHON_TOOL_WHEELS))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--require-hashes",
            "--disable-pip-version-check",
            "-r",
            str(req),
            "-d",
            str(dest),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    req.unlink()
    if done.returncode != 0:
        raise BaseImageError(
            f"downloading pip, setuptools and wheel failed:\n{done.stderr[-2000:]}"
        )


def _pack(root: Path, keep: Sequence[str], out: Path) -> None:
    """One layer tar of the root (or of only ``keep``), numeric owners, sorted, fixed mtime."""
    members = [f"./{p}" for p in keep] if keep else ["."]
    # The parents of kept paths, so that the layer creates them with sane modes.
    parents = sorted(
        {f"./{'/'.join(p.split('/')[:i])}" for p in keep for i in range(1, p.count("/") + 1)}
    )
    cmd = ["tar", "-C", str(root), "--numeric-owner", "--sort=name", "--mtime=@0", "-cf", str(out)]
    if parents:
        cmd += ["--no-recursion", *parents, "--recursion"]
    subprocess.run([*cmd, *members], check=True)


def build_base(recipe: BaseRecipe, cache: Path) -> tuple[Path, str]:
    """The recipe's OCI layout (built if missing): (layout dir, manifest digest)."""
    layout = cache / f"{recipe.name}-{recipe.key()}"
    stamp = layout / ".complete"
    if stamp.is_file():
        return layout, stamp.read_text().strip()
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"thop-base-{recipe.name}-", dir=cache) as tmp:
        work = Path(tmp)
        root = work / "root"
        if recipe.packages:
            if shutil.which("mmdebstrap") is None:
                raise BaseImageError("mmdebstrap is not installed (make system-deps)")
            env = dict(os.environ)
            if recipe.name == "python":
                wheels = work / "wheels"
                wheels.mkdir()
                _fetch_wheels(wheels)
                env["THOP_WHEELS"] = str(wheels)
            if recipe.host_ca and Path(HOST_CA_BUNDLE).is_file():
                env["THOP_HOST_CA"] = HOST_CA_BUNDLE
            cmd = [
                "mmdebstrap",
                "--mode=root",
                "--variant=minbase",
                "--quiet",
                f"--include={','.join(recipe.packages)}",
                *(f"--customize-hook={hook}" for hook in recipe.hooks),
                SUITE,
                str(root),
                MIRROR,
            ]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise BaseImageError(
                    f"mmdebstrap for the {recipe.name} base failed ({done.returncode}):\n"
                    + (done.stderr or done.stdout)[-3000:]
                )
        else:
            root.mkdir()
        for src, dst in recipe.host_files:
            target = root / dst
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
        layer = work / "layer.tar"
        _pack(root, recipe.keep or [dst for _, dst in recipe.host_files], layer)
        staged = work / "layout"
        digest = write_layout(staged, [layer], recipe.config, recipe.ref)
        (staged / ".complete").write_text(digest + "\n")
        if layout.exists():
            shutil.rmtree(layout)
        staged.rename(layout)
    # Older builds of this base (another recipe) are dead weight of ~100 MB each.
    for old in cache.glob(f"{recipe.name}-*"):
        if old != layout and (old / ".complete").is_file():
            shutil.rmtree(old, ignore_errors=True)
    return layout, digest

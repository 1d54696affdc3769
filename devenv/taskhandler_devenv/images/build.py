"""Build images/Dockerfile's three targets with BuildKit, each ``FROM`` a local base image.

``build_images()`` returns ``{ref: archive}`` for ``localhost/taskhandler-operator:<VERSION>``,
``localhost/taskhandler-probe-java:<VERSION>`` and ``localhost/taskhandler-probe-node:<VERSION>``
(VERSION = the chart's appVersion), each an OCI image archive whose index entry carries
``io.containerd.image.name`` (what ``ctr images import`` names it by). Cached by content under
``$THOP_CACHE/images/build/<key>``: the key hashes every input of the build (images/, the
operator's sources, pyproject.toml, README.md, LICENSE, .dockerignore, the base recipes, the
BuildKit version, VERSION and REVISION), so an unchanged tree returns at once without starting
BuildKit.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from taskhandler_devenv.images import bases, buildkit
from taskhandler_devenv.images.oci import IMAGE_NAME_ANNOTATION, OciError, read_archive

REPO_ROOT = Path(__file__).resolve().parents[3]
TARGETS = ("operator", "probe-java", "probe-node")
# Build folders kept besides the newest (older ones are removed after a build).
KEEP_BUILDS = 2
# BuildKit's cache kept between builds (MB): about two builds' worth of layers.
STATE_KEEP_MB = 3072
# The build's inputs beside images/ (what the Dockerfile copies, and what selects it).
INPUT_FILES = ("pyproject.toml", "README.md", "LICENSE", ".dockerignore")
INPUT_DIRS = ("images", "operator")


class ImageBuildError(RuntimeError):
    """The images could not be built (a base, BuildKit, or the Dockerfile itself)."""


def thop_cache() -> Path:
    """``$THOP_CACHE``, defaulting as hack/k8s-env.sh does."""
    if os.environ.get("THOP_CACHE"):
        return Path(os.environ["THOP_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "taskhandler-operator"


def app_version(repo: Path = REPO_ROOT) -> str:
    """The chart's appVersion: the images' tag and version label."""
    chart = (repo / "charts" / "taskhandler-operator" / "Chart.yaml").read_text(encoding="utf-8")
    found = re.search(r'^appVersion:\s*"?([^"\s]+)"?\s*$', chart, re.M)
    if found is None:
        raise ImageBuildError("charts/taskhandler-operator/Chart.yaml has no appVersion")
    return found.group(1)


def git_revision(repo: Path = REPO_ROOT) -> str:
    """The commit the images are built from (their revision label), as the Makefile takes it."""
    done = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def image_ref(target: str, version: str) -> str:
    name = "taskhandler-operator" if target == "operator" else f"taskhandler-{target}"
    return f"localhost/{name}:{version}"


def base_args(dockerfile: Path) -> dict[str, str]:
    """The Dockerfile's base image ARGs and their default refs (what each ``FROM`` names)."""
    text = dockerfile.read_text(encoding="utf-8")
    found = dict(re.findall(r"^ARG\s+(\w+_IMAGE)=(\S+)\s*$", text, re.M))
    wanted = {recipe.arg for recipe in (bases.PYTHON, bases.JRE)} | {"NODE_IMAGE"}
    if set(found) != wanted:
        raise ImageBuildError(
            f"{dockerfile}: expected base ARGs {sorted(wanted)}, found {sorted(found)}"
        )
    return found


def _skip(path: Path) -> bool:
    parts = path.parts
    return (
        "__pycache__" in parts
        or path.suffix == ".pyc"
        or any(p.endswith(".egg-info") for p in parts)
    )


def input_key(
    repo: Path, *, version: str, revision: str, base_keys: dict[str, str], buildkit_key: str
) -> str:
    """Hash of everything the build reads; equal keys mean equal images."""
    h = hashlib.sha256()
    h.update(json.dumps([version, revision, base_keys, buildkit_key], sort_keys=True).encode())
    files = [repo / name for name in INPUT_FILES if (repo / name).exists()]
    for folder in INPUT_DIRS:
        files += [p for p in (repo / folder).rglob("*") if p.is_file() and not _skip(p)]
    for path in sorted(files):
        h.update(path.relative_to(repo).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:20]


def _log(message: str) -> None:
    print(f"images: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _cached(folder: Path) -> dict[str, Path] | None:
    stamp = folder / ".complete"
    if not stamp.is_file():
        return None
    refs = json.loads(stamp.read_text())
    result = {ref: folder / name for ref, name in refs.items()}
    return result if all(p.is_file() for p in result.values()) else None


def build_images(
    repo: Path = REPO_ROOT, cache: Path | None = None, *, revision: str | None = None
) -> dict[str, Path]:
    """The three images as OCI archives (ref -> archive), built if the inputs changed."""
    cache = (cache or thop_cache()) / "images"
    version = app_version(repo)
    revision = revision or git_revision(repo)
    recipes = bases.recipes()
    bk_dir = buildkit.bins_dir(repo)
    key = input_key(
        repo,
        version=version,
        revision=revision,
        base_keys={r.name: r.key() for r in recipes},
        buildkit_key=bk_dir.name,
    )
    folder = cache / "build" / key
    if (hit := _cached(folder)) is not None:
        return hit
    with _locked(cache / ".lock"):
        if (hit := _cached(folder)) is not None:
            return hit
        return _build(repo, cache, folder, version=version, revision=revision, recipes=recipes)


def _build(
    repo: Path,
    cache: Path,
    folder: Path,
    *,
    version: str,
    revision: str,
    recipes: tuple[bases.BaseRecipe, ...],
) -> dict[str, Path]:
    start = time.monotonic()
    args = base_args(repo / "images" / "Dockerfile")
    layouts: list[tuple[str, Path]] = []
    contexts: list[tuple[str, str]] = []
    for recipe in recipes:
        t0 = time.monotonic()
        try:
            layout, digest = bases.build_base(recipe, cache / "bases")
        except (bases.BaseImageError, OSError, subprocess.CalledProcessError) as exc:
            raise ImageBuildError(f"the {recipe.name} base image: {exc}") from exc
        _log(f"base {recipe.name} ready in {time.monotonic() - t0:.1f} s ({layout.name})")
        store = f"thop-base-{recipe.name}"
        layouts.append((store, layout))
        # The named context replaces `FROM <the ARG's default>`: the frontend looks the FROM
        # ref up as `context:<ref>` with the ref as written (digest included).
        contexts.append((f"context:{args[recipe.arg]}", f"oci-layout://{store}@{digest}"))
    staging = folder.with_name(folder.name + ".partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    try:
        refs = _build_targets(repo, cache, staging, version, revision, layouts, contexts)
    except buildkit.BuildKitError as exc:
        raise ImageBuildError(str(exc)) from exc
    (staging / ".complete").write_text(json.dumps(refs, sort_keys=True))
    if folder.exists():
        shutil.rmtree(folder)
    staging.rename(folder)
    _prune(folder)
    _log(f"built {len(refs)} images in {time.monotonic() - start:.1f} s into {folder}")
    result = _cached(folder)
    assert result is not None
    return result


def _build_targets(
    repo: Path,
    cache: Path,
    staging: Path,
    version: str,
    revision: str,
    layouts: list[tuple[str, Path]],
    contexts: list[tuple[str, str]],
) -> dict[str, str]:
    """One buildkitd for the three targets; returns ref -> archive file name in ``staging``."""
    bins = buildkit.ensure_bins(repo)
    log = staging / "build.log"
    refs: dict[str, str] = {}
    with buildkit.running(bins, cache / "buildkitd-state", log) as daemon:
        for target in TARGETS:
            t0 = time.monotonic()
            ref = image_ref(target, version)
            archive = staging / f"{target}.tar"
            daemon.build(
                context=repo,
                dockerfile_dir=repo / "images",
                opts=[
                    ("filename", "Dockerfile"),
                    ("target", target),
                    ("build-arg:VERSION", version),
                    ("build-arg:REVISION", revision),
                    *contexts,
                ],
                oci_layouts=layouts,
                output=f"type=oci,dest={archive},name={ref}",
                log=log,
            )
            try:
                named = read_archive(archive).index_annotations.get(IMAGE_NAME_ANNOTATION)
            except (OciError, OSError, KeyError) as exc:
                raise ImageBuildError(f"{archive}: not a readable OCI archive: {exc}") from exc
            if named != ref:
                raise ImageBuildError(
                    f"{archive}: {IMAGE_NAME_ANNOTATION} is {named!r}, not {ref!r}"
                )
            refs[ref] = archive.name
            _log(f"{ref} built in {time.monotonic() - t0:.1f} s")
        daemon.prune(STATE_KEEP_MB, log)
    return refs


def _prune(newest: Path) -> None:
    """Keep the newest build folders only (each holds a few hundred MB of archives)."""
    others = sorted(
        (p for p in newest.parent.iterdir() if p != newest and p.is_dir()),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in others[KEEP_BUILDS - 1 :]:
        shutil.rmtree(old, ignore_errors=True)

"""The full integrity check a probe or a worker runs before it executes an artifact.

Listing only reads what identifies an artifact and trusts its stored digest; this
module recomputes every hash the format records and resolves the supervisor schema
version the runtime speaks (and refuses one this supervisor does not support). It raises
:class:`ArtifactVerificationError` with a message naming the file and the failing region or
rule. The whole check runs under a deadline (``timeout``).

Each language's reader is imported when an artifact of that language is verified: every probe pod
runs this in a fresh interpreter for one artifact, and importing the other readers (the JAR's with
``zipfile``) and the listing's walker took about 7 ms of every Go probe's start
(docs/operations.md).
"""

from __future__ import annotations

from pathlib import Path

from taskhandler_operator.artifacts.models import (
    JAVA_SUFFIX,
    TYPESCRIPT_SUFFIX,
    ArtifactVerificationError,
    Language,
    VerificationTimeout,
    VerifiedArtifact,
    verification_deadline,
)
from taskhandler_operator.artifacts.schema_versions import (
    UnknownSchemaVersion,
    check_known_schema_version,
)
from taskhandler_operator.limits import VERIFY_TIMEOUT_S

__all__ = [
    "ArtifactVerificationError",
    "VerifiedArtifact",
    "guess_language",
    "verify_artifact",
]


def guess_language(path: Path) -> Language:
    """The language a file name implies: ``.jar``, ``.min.mjs``, else a Go executable."""
    if path.name.endswith(JAVA_SUFFIX):
        return Language.JAVA
    if path.name.endswith(TYPESCRIPT_SUFFIX):
        return Language.TYPESCRIPT
    return Language.GO


def verify_artifact(
    path: Path,
    language: Language,
    bundle_root: Path | None = None,
    *,
    timeout: float | None = VERIFY_TIMEOUT_S,
) -> VerifiedArtifact:
    """Verify ``path``; for Java, ``bundle_root`` (default: its folder) gives the classpath.

    With a ``bundle_root`` the artifact must resolve inside it, and messages name it by
    its path relative to the root. Raises :class:`ArtifactVerificationError` (a
    :class:`VerificationTimeout` past ``timeout`` seconds; None: no bound).
    """
    with verification_deadline(timeout):
        try:
            verified = _verify(path, language, bundle_root)
        except VerificationTimeout as exc:
            raise VerificationTimeout(
                f"{path}: {exc} (a very large artifact, a slow disk, or a hostile file)"
            ) from None
    try:
        check_known_schema_version(str(path), verified.schema_version)
    except UnknownSchemaVersion as exc:
        raise ArtifactVerificationError(str(exc)) from None
    return verified


def _verify(path: Path, language: Language, bundle_root: Path | None) -> VerifiedArtifact:
    try:
        resolved = path.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise ArtifactVerificationError(f"{path}: is not a file ({exc})") from None
    if not resolved.is_file():
        raise ArtifactVerificationError(f"{path}: is not a file")
    root = _resolve_root(bundle_root, resolved)
    if bundle_root is not None:
        if not resolved.is_relative_to(root):
            raise ArtifactVerificationError(
                f"{path}: resolves to {resolved}, outside the bundle root {root}"
            )
        name = resolved.relative_to(root).as_posix()
    else:
        name = str(path)

    if language is Language.GO:
        from taskhandler_operator.artifacts import go

        return go.verify_file(resolved, name)
    if language is Language.TYPESCRIPT:
        from taskhandler_operator.artifacts import typescript

        return typescript.verify_file(resolved, name)
    from taskhandler_operator.artifacts import java

    classpath = _classpath(root, resolved)
    return java.verify_file(resolved, name, classpath)


def _resolve_root(bundle_root: Path | None, resolved: Path) -> Path:
    if bundle_root is None:
        return resolved.parent
    try:
        return bundle_root.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise ArtifactVerificationError(
            f"bundle root {bundle_root} is not usable ({exc})"
        ) from None


def _classpath(root: Path, artifact: Path) -> list[tuple[str, Path]]:
    """Every ``*.jar`` under the root, sorted by POSIX relative path, as the JVM would get it."""
    # The walk alone, without the listing and its other languages' readers (walk.py).
    from taskhandler_operator.artifacts.walk import walk_files

    try:
        walked = walk_files(root).files
    except OSError as exc:
        raise ArtifactVerificationError(f"bundle root {root} cannot be listed ({exc})") from None
    jars = [(item.rel_path, item.path) for item in walked if item.rel_path.endswith(JAVA_SUFFIX)]
    jars.sort(key=lambda pair: pair[0])
    if not any(p == artifact for _rel, p in jars):
        # A JAR reached only through a symlink is listed under its link path; make sure the
        # artifact itself is always on its own classpath.
        jars.append((artifact.relative_to(root).as_posix(), artifact))
        jars.sort(key=lambda pair: pair[0])
    return jars

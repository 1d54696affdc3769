"""CLI: ``fetch`` (a probe pod's init container), ``sync`` (try a source without a cluster)
and ``check-artifact-server`` (``helm test``: does the artifact server accept our signatures).

Both keep their imports inside the handlers: ``fetch`` runs in every probe pod, so it pays for
the standard library's ``urllib`` only.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from taskhandler_operator.inputfiles import (
    MAX_INPUT_BYTES,
    InputError,
    decode_utf8,
    load_yaml_documents,
    read_bounded,
)

_LANGUAGES = ["go", "java", "typescript"]


def _seconds(text: str) -> float:
    """A positive, finite number of seconds (``nan``, ``inf``, 0 and negatives are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fetch = subparsers.add_parser(
        "fetch",
        help="download signed artifact URLs into a folder, verifying each sha256",
        description="Download every item of a manifest (a JSON list of {path, url, sha256, "
        "size}) into DIR/path, verify its size and sha256, and move it into place atomically. "
        "Connection errors, 5xx answers and corrupt downloads are retried with back-off. Exit "
        "status: 0 done, 1 a download failed, 2 bad arguments or manifest.",
    )
    fetch.add_argument("--dest", required=True, type=Path, metavar="DIR")
    source = fetch.add_mutually_exclusive_group(required=True)
    source.add_argument("--manifest", metavar="JSON", help="the manifest itself")
    source.add_argument(
        "--manifest-file", type=Path, metavar="F", help="a file holding the manifest"
    )
    fetch.add_argument(
        "--timeout",
        type=_seconds,
        default=300.0,
        metavar="S",
        help="a deadline for everything, connections included (default 300)",
    )
    fetch.add_argument(
        "--max-bytes",
        type=int,
        default=4 << 30,
        metavar="N",
        help="refuse a manifest listing more bytes (default 4 GiB)",
    )
    fetch.add_argument(
        "--attempts", type=int, default=5, metavar="N", help="tries per file (default 5)"
    )
    fetch.add_argument(
        "--parallel", type=int, default=4, metavar="N", help="concurrent downloads (default 4)"
    )
    fetch.set_defaults(func=run_fetch)

    sync = subparsers.add_parser(
        "sync",
        help="sync a bundle's source into a local revision store",
        description="Read a TaskHandlerBundle YAML (or just its spec.source part), bring the "
        "source into a revision under --store as the operator would, and print the revision, "
        "its file count, bytes and the time it took. Exit status: 0 synced, 1 the sync failed, "
        "2 bad arguments or input.",
    )
    sync.add_argument("file", type=Path, metavar="BUNDLE.yaml|SOURCE.yaml")
    sync.add_argument("--store", required=True, type=Path, metavar="DIR")
    sync.add_argument(
        "--secret-file",
        type=Path,
        metavar="F",
        help="the credentials: a Kubernetes Secret manifest (data/stringData) or a plain "
        "key: value mapping",
    )
    sync.add_argument("--list", action="store_true", help="also list the candidate artifacts")
    sync.add_argument(
        "--language", choices=_LANGUAGES, help="for --list (default: the bundle's spec.language)"
    )
    sync.add_argument(
        "--namespace", metavar="NS", help="store namespace (default: metadata.namespace)"
    )
    sync.add_argument("--bundle", metavar="NAME", help="store bundle name (default: metadata.name)")
    sync.add_argument(
        "--timeout", type=_seconds, default=300.0, metavar="S", help="for the sync (default 300)"
    )
    sync.add_argument("--keep", type=int, default=3, metavar="N", help="revisions kept (default 3)")
    sync.add_argument(
        "--volume-root",
        action="append",
        type=Path,
        metavar="DIR",
        help="a folder a volume source may read below, repeatable, as the operator's "
        "THOP_VOLUME_ROOTS (default: anywhere but --store and the protected folders: the "
        "person running the command reads their own files)",
    )
    sync.add_argument("--json", action="store_true", help="print JSON")
    sync.set_defaults(func=run_sync)

    check = subparsers.add_parser(
        "check-artifact-server",
        help="check that the artifact server accepts URLs signed with a key (helm test)",
        description="Sign a URL with the key in --signing-key-file for a file no revision "
        "holds and fetch it from --url: the artifact server must answer 404 missing (it "
        "accepted the signature), then 403 tampered to the same URL with a forged signature. "
        "Connection failures are retried until --timeout. Exit status: 0 passed, 1 the check "
        "failed (the message says why), 2 bad arguments or key file.",
    )
    check.add_argument("--url", required=True, metavar="URL", help="the artifact server's base URL")
    check.add_argument(
        "--signing-key-file", required=True, type=Path, metavar="F", help="the signing key"
    )
    check.add_argument(
        "--timeout",
        type=_seconds,
        default=60.0,
        metavar="S",
        help="how long to retry connecting (default 60)",
    )
    check.set_defaults(func=run_check_artifact_server)


def run_check_artifact_server(args: argparse.Namespace) -> int:
    from taskhandler_operator.sources.selfcheck import (
        ArtifactServerCheckFailed,
        check_artifact_server,
        read_key,
    )

    try:
        key = read_key(args.signing_key_file)
    except ArtifactServerCheckFailed as exc:
        print(f"check-artifact-server: {_one_line(exc.message)}", file=sys.stderr)
        return 2
    try:
        line = check_artifact_server(args.url, key, timeout=args.timeout)
    except ArtifactServerCheckFailed as exc:
        print(f"check-artifact-server: FAILED: {_one_line(exc.message)}", file=sys.stderr)
        return 1
    print(line)
    return 0


# -- fetch ---------------------------------------------------------------------------------


def _one_line(text: str) -> str:
    return " ".join(text.split())


def run_fetch(args: argparse.Namespace) -> int:
    from taskhandler_operator.sources.fetch import (
        FetchError,
        ManifestError,
        fetch_all,
        parse_manifest,
    )

    try:
        if args.manifest is not None:
            text = args.manifest
        elif str(args.manifest_file) == "-":
            data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
            if len(data) > MAX_INPUT_BYTES:
                raise InputError(f"the manifest on stdin is over {MAX_INPUT_BYTES} bytes")
            text = decode_utf8(data, "the manifest on stdin")
        else:
            text = decode_utf8(
                read_bounded(args.manifest_file, "manifest"), f"manifest {args.manifest_file}"
            )
        items = parse_manifest(text)
    except InputError as exc:
        print(f"fetch: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except ManifestError as exc:
        print(f"fetch: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    if args.timeout <= 0 or args.max_bytes < 0 or args.attempts < 1 or args.parallel < 1:
        print("fetch: --timeout, --attempts and --parallel must be positive", file=sys.stderr)
        return 2
    try:
        result = fetch_all(
            items,
            args.dest,
            timeout=args.timeout,
            max_bytes=args.max_bytes,
            attempts=args.attempts,
            parallel=args.parallel,
        )
    except FetchError as exc:
        print(f"fetch: {_one_line(str(exc))}", file=sys.stderr)
        return 1
    print(
        f"fetched {result.files} file(s), {result.bytes} bytes into {args.dest} "
        f"({result.downloaded} downloaded, {result.attempts} attempt(s), {result.seconds:.2f}s)"
    )
    return 0


# -- sync ----------------------------------------------------------------------------------


def _load_yaml(path: Path) -> Any:
    data = read_bounded(path)
    documents = load_yaml_documents(decode_utf8(data, str(path)), str(path))
    if len(documents) != 1:
        raise InputError(f"{path} must hold exactly one YAML document, found {len(documents)}")
    return documents[0]


def read_bundle(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(source mapping, facts) from a TaskHandlerBundle or a bare source document."""
    document = _load_yaml(path)
    if not isinstance(document, dict):
        raise InputError(f"{path} must be a mapping")
    facts: dict[str, Any] = {}
    if "spec" in document or document.get("kind") == "TaskHandlerBundle":
        spec = document.get("spec")
        metadata = document.get("metadata") or {}
        if not isinstance(spec, dict) or not isinstance(spec.get("source"), dict):
            raise InputError(f"{path}: spec.source is missing")
        if not isinstance(metadata, dict):
            raise InputError(f"{path}: metadata must be a mapping")
        for key in ("name", "namespace"):
            value = metadata.get(key)
            if value is not None and not isinstance(value, str):
                raise InputError(f"{path}: metadata.{key} must be a string")
            facts[key] = value
        language = spec.get("language")
        if language is not None and not isinstance(language, str):
            raise InputError(f"{path}: spec.language must be a string")
        facts["language"] = language
        return spec["source"], facts
    if "source" in document and isinstance(document["source"], dict):
        return document["source"], facts
    return document, facts


def read_secret(path: Path) -> dict[str, bytes]:
    """Secret data from a Kubernetes Secret manifest or a plain mapping."""
    import base64
    import binascii

    document = _load_yaml(path)
    if not isinstance(document, dict):
        raise InputError(f"{path} must be a mapping")
    if document.get("kind") == "Secret" or "data" in document or "stringData" in document:
        found: dict[str, bytes] = {}
        for key, value in _string_mapping(document.get("data"), path, "data").items():
            try:
                found[key] = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise InputError(f"{path}: data.{key} is not base64") from None
        for key, value in _string_mapping(document.get("stringData"), path, "stringData").items():
            found[key] = value.encode("utf-8", "surrogatepass")
        return found
    return {
        key: value.encode("utf-8", "surrogatepass")
        for key, value in _string_mapping(document, path, "").items()
    }


def _string_mapping(value: Any, path: Path, where: str) -> dict[str, str]:
    """``value`` as a mapping of string keys to text (numbers and booleans written out)."""
    label = f"{path}: {where}" if where else str(path)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(f"{label} must be a mapping of keys to strings")
    found: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise InputError(f"{label}: key {str(key)[:40]!r} must be a string")
        if isinstance(item, bool):
            item = "true" if item else "false"
        elif isinstance(item, int | float):
            item = str(item)
        if not isinstance(item, str):
            raise InputError(f"{label}{'.' if where else ': '}{key[:80]} must be a string")
        found[key] = item
    return found


def run_sync(args: argparse.Namespace) -> int:
    import asyncio
    import json
    import time

    from pydantic import ValidationError

    from taskhandler_operator.sources.access import VolumeAccess
    from taskhandler_operator.sources.errors import SourceError
    from taskhandler_operator.sources.paths import check_name
    from taskhandler_operator.sources.spec import SourceSpec
    from taskhandler_operator.sources.store import RevisionStore
    from taskhandler_operator.sources.sync import sync

    try:
        raw_source, facts = read_bundle(args.file)
        source = SourceSpec.model_validate(raw_source)
        credentials = read_secret(args.secret_file) if args.secret_file else None
    except InputError as exc:
        print(f"sync: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'source'}: {e['msg']}" for e in exc.errors()
        )
        print(f"sync: {args.file}: invalid source: {_one_line(problems)}", file=sys.stderr)
        return 2
    if source.secret_ref is not None and credentials is None:
        print(
            f"sync: the source names Secret {source.secret_ref.name!r}; pass its data with "
            "--secret-file",
            file=sys.stderr,
        )
        return 2
    language = args.language or facts.get("language")
    if args.list and language not in _LANGUAGES:
        print("sync: --list needs --language (or a bundle with spec.language)", file=sys.stderr)
        return 2
    namespace = args.namespace or facts.get("namespace") or "default"
    bundle = args.bundle or facts.get("name") or _name_from(args.file)
    try:
        check_name(str(namespace), "namespace")
        check_name(str(bundle), "bundle")
    except ValueError as exc:
        print(f"sync: {exc}", file=sys.stderr)
        return 2
    store = RevisionStore(args.store, keep=max(1, args.keep))
    roots = [Path(r).absolute() for r in args.volume_root or [Path("/")]]
    volumes = VolumeAccess.for_operator(roots, store=store.root)

    async def go() -> Any:
        await store.open()
        return await sync(
            source,
            credentials,
            store,
            namespace=namespace,
            bundle=bundle,
            timeout=args.timeout,
            volumes=volumes,
        )

    started = time.perf_counter()
    try:
        revision = asyncio.run(go())
    except SourceError as exc:
        print(f"sync: {exc.reason}: {exc.message}", file=sys.stderr)
        return 1
    took = time.perf_counter() - started
    candidates: list[dict[str, Any]] = []
    if args.list:
        candidates = _candidates(revision.path, str(language))
    if args.json:
        document = {**revision.model_dump(mode="json"), "seconds": round(took, 3)}
        if args.list:
            document["candidates"] = candidates
        print(json.dumps(document, indent=2))
        return 0
    rows = [
        ("revision", revision.id),
        ("source", revision.source),
        ("kind", revision.kind),
        ("files", str(revision.file_count)),
        ("bytes", str(revision.bytes)),
        ("path", str(revision.path)),
        ("took", f"{took:.2f}s"),
    ]
    for key, value in rows:
        print(f"{key:<9} {value}")
    if args.list:
        print()
        for c in candidates:
            verdict = "candidate" if c["error"] is None else f"error: {c['error']}"
            print(f"{c['rel_path']}  {c['size_bytes']}  {c['cache_digest'] or '-'}  {verdict}")
        print(f"{len(candidates)} candidate(s) ({language})")
    return 0


def _name_from(path: Path) -> str:
    import re

    name = re.sub(r"[^a-z0-9-]+", "-", path.stem.lower()).strip("-")
    return name or "bundle"


def _candidates(root: Path, language: str) -> list[dict[str, Any]]:
    from taskhandler_operator.artifacts.listing import list_candidates
    from taskhandler_operator.artifacts.models import Language

    result = list_candidates(root, Language(language))
    return [
        {
            "rel_path": c.rel_path,
            "size_bytes": c.size_bytes,
            "cache_digest": c.cache_digest,
            "error": c.error,
        }
        for c in result.candidates
    ]

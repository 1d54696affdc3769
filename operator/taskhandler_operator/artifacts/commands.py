"""CLI: ``inspect`` (list candidates), ``plan`` (fast path against known artifacts), ``verify``.

Paths in a bundle are untrusted text: every one printed in a table or a message goes through
:func:`display`, so a newline cannot forge a row, an escape sequence cannot reach the terminal
and a name that is not UTF-8 cannot crash the output.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from taskhandler_operator.artifacts.models import Candidate, Language
from taskhandler_operator.inputfiles import InputError, read_bounded
from taskhandler_operator.limits import KNOWN_ARTIFACTS_MAX_BYTES

_LANGUAGES = [language.value for language in Language]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    inspect = subparsers.add_parser(
        "inspect",
        help="list the candidate artifacts of a bundle folder",
        description="List the artifacts of one language under DIR, with their stored cache "
        "digest and any error that keeps them from being probed. Never hashes an artifact.",
    )
    inspect.add_argument("dir", type=Path, metavar="DIR")
    inspect.add_argument("--language", required=True, choices=_LANGUAGES)
    inspect.add_argument("--json", action="store_true", help="print JSON instead of a table")
    inspect.set_defaults(func=run_inspect)

    plan = subparsers.add_parser(
        "plan",
        help="show which artifacts would reuse a recorded answer, be probed or be rejected",
        description="List DIR and decide each candidate against known artifacts (a JSON list "
        "shaped like Airflow's TaskHandlerArtifact: bundle_name, relative_fileloc, size_bytes, "
        "cache_digest, task_handlers).",
    )
    plan.add_argument("dir", type=Path, metavar="DIR")
    plan.add_argument("--bundle-name", required=True, metavar="B")
    plan.add_argument("--known", type=Path, metavar="FILE.json", help="known artifacts")
    plan.add_argument(
        "--language",
        choices=_LANGUAGES,
        help="list one language only (default: every language)",
    )
    plan.add_argument("--json", action="store_true", help="print JSON instead of a table")
    plan.set_defaults(func=run_plan)

    verify = subparsers.add_parser(
        "verify",
        help="run the full integrity check of one artifact",
        description="Verify FILE as a worker would before running it; print its supervisor "
        "schema version, or the reason it fails.",
    )
    verify.add_argument("file", type=Path, metavar="FILE")
    verify.add_argument(
        "--language",
        choices=_LANGUAGES,
        help="default: from the name (.jar, .min.mjs, else a Go executable)",
    )
    verify.add_argument(
        "--bundle-root",
        type=Path,
        help="the bundle folder (Java classpath; default: the file's folder)",
    )
    verify.add_argument("--json", action="store_true", help="print JSON")
    verify.set_defaults(func=run_verify)


# -- inspect -------------------------------------------------------------------------------


def _candidate_json(candidate: Candidate) -> dict[str, Any]:
    return {
        "rel_path": candidate.rel_path,
        "size_bytes": candidate.size_bytes,
        "cache_digest": candidate.cache_digest,
        "error": candidate.error,
    }


def display(text: object) -> str:
    """``text`` on one line of valid, printable text: control characters, line separators and
    undecodable bytes (surrogates from the file system) escaped, backslashes doubled."""
    value = str(text)
    if value.isprintable() and "\\" not in value:
        return value
    out: list[str] = []
    for ch in value:
        if ch == "\\":
            out.append("\\\\")
        elif "\udc80" <= ch <= "\udcff":
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape", "backslashreplace").decode("ascii"))
    return "".join(out)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO) -> None:
    rows = [[display(cell) for cell in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    for row in [headers, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        print("  ".join(cells).rstrip(), file=out)


def run_inspect(args: argparse.Namespace) -> int:
    from taskhandler_operator.artifacts.listing import list_candidates

    try:
        result = list_candidates(args.dir, Language(args.language))
    except OSError as exc:
        print(f"inspect: {display(exc)}", file=sys.stderr)
        return 2
    if args.json:
        document = {
            "candidates": [_candidate_json(c) for c in result.candidates],
            "problems": [{"rel_path": p.rel_path, "message": p.message} for p in result.problems],
        }
        print(json.dumps(document, indent=2))
        return 0
    rows = [
        (
            c.rel_path,
            str(c.size_bytes),
            c.cache_digest or "-",
            "candidate" if c.error is None else f"error: {c.error}",
        )
        for c in result.candidates
    ]
    _table(("PATH", "SIZE", "DIGEST", "VERDICT"), rows, sys.stdout)
    for problem in result.problems:
        print(f"problem: {display(problem.rel_path)}: {display(problem.message)}")
    print(
        f"{len(result.candidates)} candidate(s), {result.stats.files_walked} file(s) walked, "
        f"{result.stats.bytes_read} byte(s) read"
    )
    return 0


# -- plan ----------------------------------------------------------------------------------


def run_plan(args: argparse.Namespace) -> int:
    from pydantic import TypeAdapter, ValidationError

    from taskhandler_operator.artifacts.listing import list_candidates
    from taskhandler_operator.artifacts.planner import plan_probes
    from taskhandler_operator.records import TaskHandlerArtifact

    known: list[TaskHandlerArtifact] = []
    if args.known is not None:
        try:
            raw = read_bounded(args.known, "--known", max_bytes=KNOWN_ARTIFACTS_MAX_BYTES)
            known = TypeAdapter(list[TaskHandlerArtifact]).validate_json(raw)
        except InputError as exc:
            print(f"plan: {display(exc)}", file=sys.stderr)
            return 2
        except ValidationError as exc:
            print(
                f"plan: --known {display(args.known)} is not a list of known artifacts: "
                f"{_first_error(exc)}",
                file=sys.stderr,
            )
            return 2
        finally:
            raw = b""  # one copy at a time: the models are all that is kept
    languages = [Language(args.language)] if args.language else list(Language)
    candidates: list[Candidate] = []
    try:
        for language in languages:
            candidates.extend(list_candidates(args.dir, language).candidates)
    except OSError as exc:
        print(f"plan: {display(exc)}", file=sys.stderr)
        return 2
    candidates.sort(key=lambda c: c.rel_path)
    plan = plan_probes(candidates, known, args.bundle_name)
    if args.json:
        document = {
            "cached": [_candidate_json(c) for c, _record in plan.cached],
            "probe": [_candidate_json(c) for c in plan.probe],
            "rejected": [_candidate_json(c) for c in plan.rejected],
        }
        print(json.dumps(document, indent=2))
        return 0
    rows: list[tuple[str, str, str, str]] = []
    for candidate, record in plan.cached:
        handlers = sum(len(decls) for decls in record.task_handlers.values())
        rows.append(
            ("cached", candidate.rel_path, str(candidate.size_bytes), f"{handlers} handler(s)")
        )
    for candidate in plan.probe:
        why = "no stored digest" if candidate.cache_digest is None else "changed or new"
        rows.append(("probe", candidate.rel_path, str(candidate.size_bytes), why))
    for candidate in plan.rejected:
        rows.append(
            ("rejected", candidate.rel_path, str(candidate.size_bytes), candidate.error or "")
        )
    _table(("DECISION", "PATH", "SIZE", "DETAIL"), rows, sys.stdout)
    print(
        f"{len(plan.cached)} cached, {len(plan.probe)} to probe, {len(plan.rejected)} rejected "
        f"(bundle {args.bundle_name!r}, {len(known)} known artifact(s))"
    )
    return 0


def _first_error(exc: Any) -> str:
    errors = exc.errors(include_url=False, include_input=False)
    if not errors:
        return "no details"
    first = errors[0]
    where = ".".join(str(part) for part in first.get("loc", ())) or "(top level)"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return display(f"{where}: {first.get('msg', '')}{more}")[:300]


# -- verify --------------------------------------------------------------------------------


def run_verify(args: argparse.Namespace) -> int:
    from taskhandler_operator.artifacts.verify import (
        ArtifactVerificationError,
        guess_language,
        verify_artifact,
    )

    language = Language(args.language) if args.language else guess_language(args.file)
    try:
        verified = verify_artifact(args.file, language, args.bundle_root)
    except ArtifactVerificationError as exc:
        if args.json:
            print(json.dumps({"ok": False, "error": str(exc)}, indent=2))
        else:
            print(f"verify: FAILED: {display(exc)}", file=sys.stderr)
        return 1
    if args.json:
        document = {
            "ok": True,
            "path": str(verified.path),
            "language": verified.language.value,
            "schema_version": verified.schema_version,
            "size_bytes": verified.size_bytes,
            "cache_digest": verified.cache_digest,
            "main_class": verified.main_class,
            "classpath": [str(p) for p in verified.classpath],
        }
        print(json.dumps(document, indent=2))
        return 0
    print(verified.schema_version)
    return 0

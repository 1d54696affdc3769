"""``taskhandler-operator diff`` and ``rollback``: a bundle's publications from the command line.

Both name a TaskHandlerBundle as ``NAMESPACE/NAME``; its ``spec.bundleName`` (the key of its
rows and history) is read from the apiserver with the kubeconfig (``--kubeconfig``,
``$KUBECONFIG``, the pod's service account, then ``~/.kube/config``). The history is read from
the database of the operator's settings (``--url``/``--url-file``, ``THOP_DATABASE_URL``,
``THOP_DATABASE_URL_FILE``); see docs/operator.md, "Publication under control".

* ``diff`` prints the whole change set of the bundle's pending (held) change, or else of its
  last publication (``--revision``: of that revision's), one binding a line after ``#``
  header lines, or one JSON document (``--json``).
* ``rollback`` sets the annotation ``langsdk.dev/rollback-to`` to a revision of the history
  (default: the newest publication of another revision than the current one); the operator
  republishes it on its next pass. It refuses a revision the history lacks, or whose artifacts'
  answers are gone (the operator would refuse it too, with an Event).

Exit codes: 0 done; 1 refused (no such bundle, nothing recorded, a revision not in the
history); 2 usage (a malformed ``NAMESPACE/NAME``, no database URL, no kubeconfig); 75
(``EX_TEMPFAIL``) only when retrying may help (database or apiserver unreachable).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from taskhandler_operator.settings import SettingsError, env_of, load_settings

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from taskhandler_operator.publication.history import Publication

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_TEMPFAIL = 75
#: The field manager of the CLI's annotation (the operator records it as who asked).
FIELD_MANAGER = "taskhandler-operator-cli"
#: Seconds one apiserver request may take.
REQUEST_TIMEOUT = 30
#: A revision given by a part of it (a git commit) needs at least this many characters.
MIN_REVISION_PART = 7
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


class CommandError(Exception):
    """A refusal or failure the command reports in one line, with its exit code."""

    def __init__(self, message: str, code: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.code = code


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    diff = subparsers.add_parser(
        "diff",
        help="print the change set of a bundle's pending change, or else of its last "
        "publication, one binding a line",
        description=(
            "Print which bindings the pending (held) change of a TaskHandlerBundle adds, "
            "removes, moves to another artifact or changes; without one, those of its last "
            "publication. Text: '#' header lines, then one binding a line; --json: one document."
        ),
    )
    _common(diff)
    diff.add_argument("--json", action="store_true", help="print one JSON document")
    diff.add_argument(
        "--revision",
        metavar="REV",
        help="the newest publication of this revision instead (a unique part of it will do)",
    )
    diff.add_argument(
        "--bundle-name",
        metavar="BUNDLE",
        help="spec.bundleName, when the apiserver is not at hand (skips the kubeconfig)",
    )
    diff.set_defaults(func=run_diff)

    rollback = subparsers.add_parser(
        "rollback",
        help="republish a recorded publication of a bundle (sets langsdk.dev/rollback-to)",
        description=(
            "Set the annotation langsdk.dev/rollback-to on a TaskHandlerBundle: the operator "
            "republishes that revision's recorded bindings in one transaction, without a sync "
            "or a probe, and holds there until the annotation is removed "
            "(kubectl annotate thb NAME langsdk.dev/rollback-to-)."
        ),
    )
    _common(rollback)
    rollback.add_argument(
        "--to",
        metavar="REV",
        help="the revision to roll back to (default: the newest publication of another "
        "revision than the current one; a unique part of a revision will do)",
    )
    rollback.set_defaults(func=run_rollback)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="NAMESPACE/NAME", help="the TaskHandlerBundle")
    parser.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig file (default: $KUBECONFIG, in a pod its service account, else "
        "~/.kube/config)",
    )
    parser.add_argument(
        "--url",
        help=f"SQLAlchemy URL of Airflow's database (default: ${env_of('database_url')})",
    )
    parser.add_argument(
        "--url-file",
        help=f"a file holding that URL (default: ${env_of('database_url_file')})",
    )


# --- shared steps -------------------------------------------------------------------------------


def _target(text: str) -> tuple[str, str]:
    namespace, sep, name = text.partition("/")
    if not sep or not _DNS_LABEL.fullmatch(namespace) or not _DNS_SUBDOMAIN.fullmatch(name):
        raise CommandError(
            f"{text!r} is not NAMESPACE/NAME of a TaskHandlerBundle (e.g. airflow/orders)",
            EXIT_USAGE,
        )
    return namespace, name


def _database_url(args: argparse.Namespace) -> str:
    flags = argparse.Namespace(database_url=args.url, database_url_file=args.url_file)
    try:
        url = load_settings(flags).resolved_database_url()
    except SettingsError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    if not url:
        raise CommandError(
            f"no database URL: pass --url or --url-file, or set {env_of('database_url')}",
            EXIT_USAGE,
        )
    return url


def _api_client(kubeconfig: str | None) -> Any:
    from kubernetes import config

    try:
        if kubeconfig:
            return config.new_client_from_config(config_file=kubeconfig)
        try:
            config.load_incluster_config()
        except config.ConfigException:
            return config.new_client_from_config()
        from kubernetes import client

        return client.ApiClient()
    except (config.ConfigException, OSError) as exc:
        where = kubeconfig or "~/.kube/config"
        raise CommandError(
            f"no usable kubeconfig ({where}: {exc}); pass --kubeconfig", EXIT_USAGE
        ) from None


def _kube_failure(what: str, exc: BaseException) -> CommandError:
    from taskhandler_operator.controller.kubeapi import classify

    typed = classify(what, exc)
    return CommandError(str(typed), EXIT_TEMPFAIL if typed.retryable else EXIT_REFUSED)


def _read_bundle(api_client: Any, namespace: str, name: str) -> dict[str, Any]:
    import urllib3
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from taskhandler_operator.kube import names

    try:
        found = client.CustomObjectsApi(api_client).get_namespaced_custom_object(
            names.GROUP,
            names.VERSION,
            namespace,
            names.PLURAL,
            name,
            _request_timeout=REQUEST_TIMEOUT,
        )
    except ApiException as exc:
        if exc.status == 404:
            raise CommandError(f"no TaskHandlerBundle {namespace}/{name}") from None
        raise _kube_failure(f"read TaskHandlerBundle {namespace}/{name}", exc) from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise _kube_failure(f"read TaskHandlerBundle {namespace}/{name}", exc) from None
    if not isinstance(found, dict):
        raise CommandError(f"read TaskHandlerBundle {namespace}/{name}: not an object")
    return found


def _bundle_name(bundle: dict[str, Any], namespace: str, name: str) -> str:
    bundle_name = (bundle.get("spec") or {}).get("bundleName")
    if not isinstance(bundle_name, str) or not bundle_name:
        raise CommandError(f"TaskHandlerBundle {namespace}/{name} has no spec.bundleName")
    return bundle_name


def _run_db(url: str, work: Any) -> Any:
    """Run ``work(engine)`` (a coroutine function) on an engine of its own; typed failures."""
    from taskhandler_operator.db.engine import DatabaseError, RetryableDatabaseError, create_engine

    async def main() -> Any:
        engine = create_engine(url, pool_size=1)
        try:
            return await work(engine)
        finally:
            await engine.dispose()

    try:
        return asyncio.run(main())
    except DatabaseError as exc:
        code = EXIT_TEMPFAIL if isinstance(exc, RetryableDatabaseError) else EXIT_REFUSED
        raise CommandError(str(exc), code) from None


def _match_revision(wanted: str, revisions: list[str], bundle_name: str) -> str:
    """The history's revision ``wanted`` names: itself, or the one revision containing it."""
    if wanted in revisions:
        return wanted
    if len(wanted) >= MIN_REVISION_PART:
        found = sorted({r for r in revisions if wanted in r})
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise CommandError(
                f"revision {wanted!r} is ambiguous in the history of bundle {bundle_name!r}: "
                + ", ".join(found)
            )
    known = ", ".join(dict.fromkeys(revisions)) or "none"
    raise CommandError(
        f"revision {wanted!r} is not in the publication history of bundle {bundle_name!r} "
        f"(recorded: {known})"
    )


def _fail(exc: CommandError) -> int:
    print(f"error: {exc}", file=sys.stderr)
    return exc.code


# --- diff ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Shown:
    state: str  # "pending" or "published"
    publication: Publication


def run_diff(args: argparse.Namespace) -> int:
    try:
        namespace, name = _target(args.target)
        url = _database_url(args)
        bundle_name = args.bundle_name
        if not bundle_name:
            bundle = _read_bundle(_api_client(args.kubeconfig), namespace, name)
            bundle_name = _bundle_name(bundle, namespace, name)
        shown = _run_db(url, lambda engine: _diff_read(engine, bundle_name, args.revision))
    except CommandError as exc:
        return _fail(exc)
    if args.json:
        print(json.dumps(_diff_document(namespace, name, shown), sort_keys=True))
    else:
        for line in _diff_text(namespace, name, shown):
            print(line)
    return 0


async def _diff_read(engine: AsyncEngine, bundle_name: str, revision: str | None) -> _Shown:
    from taskhandler_operator.db.publications import (
        list_publications,
        load_publication,
        pending_change,
    )

    if revision is None:
        pending = await pending_change(engine, bundle_name)
        if pending is not None:
            return _Shown("pending", pending)
        last = await load_publication(engine, bundle_name)
        if last is None:
            raise CommandError(
                f"bundle {bundle_name!r} has no pending change and no publication recorded"
            )
        return _Shown("published", last)
    history = await list_publications(engine, bundle_name)
    revisions = [p.revision for p in history if p.revision]
    full = _match_revision(revision, revisions, bundle_name)
    found = await load_publication(engine, bundle_name, full)
    if found is None:  # trimmed between the two reads
        raise CommandError(f"revision {full!r} is no longer in the history of {bundle_name!r}")
    return _Shown("published", found)


def _diff_document(namespace: str, name: str, shown: _Shown) -> dict[str, Any]:
    pub = shown.publication
    change = pub.change
    changes = [] if change is None else [c.model_dump(mode="json") for c in change.changes]
    return {
        "namespace": namespace,
        "name": name,
        "bundle_name": pub.bundle_name,
        "state": shown.state,
        **pub.model_dump(mode="json", exclude={"bindings", "change", "bundle_name"}),
        "changes": changes,
    }


def _diff_text(namespace: str, name: str, shown: _Shown) -> list[str]:
    pub = shown.publication
    when = f"{pub.recorded_at:%Y-%m-%dT%H:%M:%SZ}"
    revision = pub.revision or "(no revision)"
    target = f"{namespace}/{name} (bundle {pub.bundle_name})"
    if shown.state == "pending":
        lines = [f"# pending change of {target}: revision {revision}, held since {when}"]
        if pub.reason:
            lines.append(f"# held: {pub.reason}")
    else:
        lines = [f"# publication {pub.id} of {target}: revision {revision}, {pub.kind} {when}"]
        who = [f"by {pub.operator}"] if pub.operator else []
        if pub.approved_by:
            who.append(f"approved by {pub.approved_by}")
        if pub.reason:
            who.append(pub.reason)
        if who:
            lines.append("# " + "; ".join(who))
    lines.append(f"# {pub.counts.describe()}")
    if pub.change is not None:
        lines += pub.change.lines()
    return lines


# --- rollback -----------------------------------------------------------------------------------


def run_rollback(args: argparse.Namespace) -> int:
    try:
        namespace, name = _target(args.target)
        url = _database_url(args)
        api_client = _api_client(args.kubeconfig)
        bundle = _read_bundle(api_client, namespace, name)
        bundle_name = _bundle_name(bundle, namespace, name)
        revision = _run_db(url, lambda engine: _rollback_target(engine, bundle_name, args.to))
        before = _annotate(api_client, bundle, namespace, name, revision)
    except CommandError as exc:
        return _fail(exc)
    from taskhandler_operator.kube.names import ANNOTATION_ROLLBACK_TO

    if before == revision:
        print(f"{namespace}/{name}: {ANNOTATION_ROLLBACK_TO} is already {revision}")
    else:
        print(f"{namespace}/{name}: {ANNOTATION_ROLLBACK_TO}={revision} set")
    print(
        "the operator republishes that revision's bindings on its next pass and holds there; "
        f"to follow the source again: kubectl -n {namespace} annotate thb {name} "
        f"{ANNOTATION_ROLLBACK_TO}-"
    )
    return 0


async def _rollback_target(engine: AsyncEngine, bundle_name: str, wanted: str | None) -> str:
    from taskhandler_operator.db.engine import connection
    from taskhandler_operator.db.publications import (
        artifact_digests,
        list_publications,
        load_publication,
    )

    history = await list_publications(engine, bundle_name)
    revisions = [p.revision for p in history if p.revision]
    if not revisions:
        raise CommandError(f"bundle {bundle_name!r} has no publication recorded to roll back to")
    if wanted is not None:
        revision = _match_revision(wanted, revisions, bundle_name)
    else:
        current = revisions[0]
        earlier = [r for r in revisions if r != current]
        if not earlier:
            raise CommandError(
                f"bundle {bundle_name!r} has no publication of another revision than the "
                f"current one ({current}) to roll back to"
            )
        revision = earlier[0]
    recorded = await load_publication(engine, bundle_name, revision)
    if recorded is None or recorded.bindings is None:
        raise CommandError(f"revision {revision!r} is no longer in the history of {bundle_name!r}")
    async with connection(engine) as conn:
        stored = await artifact_digests(conn, bundle_name)
    gone = sorted(
        {
            r.artifact_path
            for r in recorded.bindings
            if stored.get(r.artifact_path, "\0") != r.artifact_digest
        }
    )
    if gone:
        more = f" and {len(gone) - 1} more" if len(gone) > 1 else ""
        raise CommandError(
            f"cannot roll back bundle {bundle_name!r} to revision {revision}: the answers of its "
            f"artifacts are no longer known ({gone[0]}{more} is gone or changed since)"
        )
    return revision


def _annotate(
    api_client: Any, bundle: dict[str, Any], namespace: str, name: str, revision: str
) -> str | None:
    """Set the rollback annotation; its value before. The patch carries the resourceVersion
    read, so the annotation lands on the bundle the revision was chosen for."""
    import urllib3
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from taskhandler_operator.kube import names

    meta = bundle.get("metadata") or {}
    before = (meta.get("annotations") or {}).get(names.ANNOTATION_ROLLBACK_TO)
    body = {
        "metadata": {
            "resourceVersion": meta.get("resourceVersion"),
            "annotations": {names.ANNOTATION_ROLLBACK_TO: revision},
        }
    }
    try:
        client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
            names.GROUP,
            names.VERSION,
            namespace,
            names.PLURAL,
            name,
            body,
            field_manager=FIELD_MANAGER,
            _request_timeout=REQUEST_TIMEOUT,
        )
    except ApiException as exc:
        if exc.status == 404:
            raise CommandError(f"no TaskHandlerBundle {namespace}/{name}") from None
        if exc.status == 409:
            raise CommandError(
                f"TaskHandlerBundle {namespace}/{name} changed while the revision was chosen; "
                "run the command again",
                EXIT_TEMPFAIL,
            ) from None
        raise _kube_failure(f"annotate TaskHandlerBundle {namespace}/{name}", exc) from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise _kube_failure(f"annotate TaskHandlerBundle {namespace}/{name}", exc) from None
    return before if isinstance(before, str) else None

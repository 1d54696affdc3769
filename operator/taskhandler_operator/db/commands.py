"""``taskhandler-operator db ...``: schema upgrade and check, bundle-name claims.

Exit codes: 0 done, 1 refused or failed (the message says why: a malformed URL, a database
that does not exist, a refused login, a schema that does not fit), 2 usage error, 75
(``EX_TEMPFAIL``) only when retrying may help: the server could not be reached, or the
connection broke.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from taskhandler_operator.settings import SettingsError, env_of, load_settings

URL_ENV = env_of("database_url")
URL_FILE_ENV = env_of("database_url_file")

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_TEMPFAIL = 75


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    db = subparsers.add_parser("db", help="the binding tables in Airflow's metadata database")
    db_commands = db.add_subparsers(dest="db_command", metavar="DB_COMMAND", required=True)

    url_help = f"SQLAlchemy URL of Airflow's PostgreSQL database (default: ${URL_ENV})"
    file_help = f"a file holding that URL, e.g. a mounted Secret (default: ${URL_FILE_ENV})"
    upgrade = db_commands.add_parser(
        "upgrade",
        help="create or adopt the binding tables and run the operator's migrations (idempotent)",
    )
    upgrade.add_argument("--url", help=url_help)
    upgrade.add_argument("--url-file", help=file_help)
    upgrade.add_argument("--revision", default="head", help="target revision (default: head)")
    upgrade.set_defaults(func=_upgrade)

    check = db_commands.add_parser(
        "check", help="report whether the schema matches this operator version; changes nothing"
    )
    check.add_argument("--url", help=url_help)
    check.add_argument("--url-file", help=file_help)
    check.set_defaults(func=_check)

    handover = db_commands.add_parser(
        "handover",
        help="before upgrading to an Airflow release that creates the binding tables itself: "
        "hold their rows in thop_ tables and remove the tables (one transaction); after "
        "`airflow db migrate`, `db upgrade` moves the rows back",
    )
    handover.add_argument(
        "--undo",
        action="store_true",
        help="put the held tables back (only before Airflow's migration created its own)",
    )
    handover.add_argument("--url", help=url_help)
    handover.add_argument("--url-file", help=file_help)
    handover.set_defaults(func=_handover)

    bundle = db_commands.add_parser(
        "dag-bundle",
        help="does Airflow know this DagBundle, at the revision the bindings were probed at? "
        "(exit 0 only when in sync)",
    )
    bundle.add_argument("bundle_name", metavar="BUNDLE", help="spec.bundleName of the bundle")
    bundle.add_argument(
        "--revision",
        help="the source revision to compare with (default: the newest probe revision "
        "recorded for the bundle's bindings)",
    )
    bundle.add_argument("--url", help=url_help)
    bundle.add_argument("--url-file", help=file_help)
    bundle.set_defaults(func=_dag_bundle)

    claims = db_commands.add_parser(
        "claims",
        help="which TaskHandlerBundle owns each bundle name, and the unowned rows; free a name "
        "the operator cannot (a claim from another cluster id)",
    )
    claims_commands = claims.add_subparsers(
        dest="claims_command", metavar="CLAIMS_COMMAND", required=True
    )
    listing = claims_commands.add_parser(
        "list", help="every bundle name with a claim or rows: holder, queues, row counts"
    )
    listing.add_argument("--url", help=url_help)
    listing.add_argument("--url-file", help=file_help)
    listing.set_defaults(func=_claims_list)
    release = claims_commands.add_parser(
        "release",
        help="free a bundle name (its claim and queue claims); its rows stay for the next "
        "claimant to adopt unless --delete-rows",
    )
    release.add_argument("bundle_name", metavar="BUNDLE", help="spec.bundleName of the bundle")
    release.add_argument(
        "--uid",
        help="release only if the resource with this uid still holds the name (the command "
        "a BundleNameConflict condition prints has it)",
    )
    release.add_argument(
        "--delete-rows",
        action="store_true",
        help="also delete the name's artifact, binding and problem rows (Airflow's tasks on "
        "them lose their handlers)",
    )
    release.add_argument("--url", help=url_help)
    release.add_argument("--url-file", help=file_help)
    release.set_defaults(func=_claims_release)


def _url(args: argparse.Namespace) -> str | None:
    """The URL from the flags or the environment, read through the operator's settings."""
    flags = argparse.Namespace(database_url=args.url, database_url_file=args.url_file)
    try:
        url = load_settings(flags).resolved_database_url()
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    if not url:
        print(f"error: no database URL: pass --url or set {URL_ENV}", file=sys.stderr)
    return url


def _fail(exc: Exception) -> int:
    from taskhandler_operator.db.engine import RetryableDatabaseError

    print(f"error: {exc}", file=sys.stderr)
    return EXIT_TEMPFAIL if isinstance(exc, RetryableDatabaseError) else EXIT_REFUSED


def _upgrade(args: argparse.Namespace) -> int:
    from taskhandler_operator.db.engine import DatabaseError
    from taskhandler_operator.db.migrate import upgrade

    url = _url(args)
    if url is None:
        return EXIT_USAGE
    try:
        report = upgrade(url, args.revision)
    except DatabaseError as exc:
        return _fail(exc)
    if report.restored is not None:
        from taskhandler_operator.db.handover import restore_summary

        print(f"{report.database}: {restore_summary(report.restored)}")
    if report.adopted:
        print(f"{report.database}: adopted existing {', '.join(report.adopted)}")
    if report.recreated:
        print(
            f"{report.database}: created {', '.join(report.recreated)} again (dropped since, "
            "as by an Airflow downgrade); every bundle publishes its bindings on its next pass"
        )
    if report.changed:
        print(f"{report.database}: upgraded from {report.before or '(empty)'} to {report.after}")
    else:
        print(f"{report.database}: already at {report.after}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from taskhandler_operator.db.engine import DatabaseError
    from taskhandler_operator.db.migrate import check
    from taskhandler_operator.db.schema_check import summarize

    url = _url(args)
    if url is None:
        return EXIT_USAGE
    try:
        report = check(url)
    except DatabaseError as exc:
        return _fail(exc)
    print(f"{report.database}: revision {report.current or '(none)'}, head {report.head}")
    for name in report.missing_airflow_tables:
        print(f"missing Airflow table {name!r}")
    for name in report.missing_tables:
        print(f"missing table {name!r}")
    for name, differences in report.differences.items():
        print(summarize(name, differences))
    for name, differences in report.definition_differences.items():
        for difference in differences:
            print(f"table {name!r}: {difference}")
    if report.ok:
        print("schema OK")
        return 0
    if report.missing_airflow_tables:
        # `db upgrade` would refuse too: the binding tables hang off Airflow's own schema.
        print(
            "Airflow's metadata schema is missing; run `airflow db migrate` against this "
            "database first, then `taskhandler-operator db upgrade`",
            file=sys.stderr,
        )
        return EXIT_REFUSED
    if report.differences:
        print(
            "schema does not match; fix or drop the tables named above (see "
            "docs/database.md), then run `taskhandler-operator db upgrade`",
            file=sys.stderr,
        )
        return EXIT_REFUSED
    print("schema does not match; run `taskhandler-operator db upgrade`", file=sys.stderr)
    return EXIT_REFUSED


def _handover(args: argparse.Namespace) -> int:
    from taskhandler_operator.db.engine import DatabaseError
    from taskhandler_operator.db.migrate import hand_over, undo_handover
    from taskhandler_operator.db.tables import HOLD_ARTIFACT_TABLE, HOLD_BINDING_TABLE

    url = _url(args)
    if url is None:
        return EXIT_USAGE
    try:
        report = undo_handover(url) if args.undo else hand_over(url)
    except DatabaseError as exc:
        return _fail(exc)
    rows = f"{report.artifacts} artifact and {report.bindings} binding rows"
    if args.undo:
        print(f"{report.database}: put {rows} back; the handover is undone")
    else:
        print(
            f"{report.database}: handed over: {rows} wait in {HOLD_ARTIFACT_TABLE} and "
            f"{HOLD_BINDING_TABLE}. Next: `airflow db migrate`, then "
            "`taskhandler-operator db upgrade`"
        )
    return 0


def _dag_bundle(args: argparse.Namespace) -> int:
    from sqlalchemy import inspect

    from taskhandler_operator.db.dag_bundle import dag_bundle_sync_sync
    from taskhandler_operator.db.engine import (
        DatabaseError,
        create_sync_engine,
        describe,
        translate_errors_sync,
    )
    from taskhandler_operator.db.tables import (
        ARTIFACT_TABLE,
        BINDING_TABLE,
        HOLD_ARTIFACT_TABLE,
        PROBE_TABLE,
    )

    url = _url(args)
    if url is None:
        return EXIT_USAGE
    try:
        engine = create_sync_engine(url)
        try:
            with translate_errors_sync(), engine.connect() as conn:
                inspector = inspect(conn)
                if not inspector.has_table("dag_bundle"):
                    raise DatabaseError(
                        f"{describe(url)} has no Airflow table 'dag_bundle' (Airflow 3 keeps its "
                        "DagBundles there); is this Airflow's metadata database?"
                    )
                if not inspector.has_table(ARTIFACT_TABLE) and inspector.has_table(
                    HOLD_ARTIFACT_TABLE
                ):
                    raise DatabaseError(
                        f"{describe(url)}: a handover is pending (the bindings wait in "
                        f"{HOLD_ARTIFACT_TABLE}); run `airflow db migrate`, then "
                        "`taskhandler-operator db upgrade`, and ask again"
                    )
                for name in (ARTIFACT_TABLE, BINDING_TABLE, PROBE_TABLE):
                    if not inspector.has_table(name):
                        raise DatabaseError(
                            f"{describe(url)} has no table {name!r}; run "
                            "`taskhandler-operator db upgrade` first"
                        )
                found = dag_bundle_sync_sync(conn, args.bundle_name, args.revision)
        finally:
            engine.dispose()
    except DatabaseError as exc:
        return _fail(exc)
    print(f"{found.condition()['type']}={found.status} reason={found.reason}: {found.message}")
    return 0 if found.in_sync else EXIT_REFUSED


def _claims_list(args: argparse.Namespace) -> int:
    import asyncio

    from taskhandler_operator.db.claims_admin import list_claims
    from taskhandler_operator.db.engine import DatabaseError, create_engine

    url = _url(args)
    if url is None:
        return EXIT_USAGE

    async def read() -> list[Any]:
        engine = create_engine(url)
        try:
            return await list_claims(engine)
        finally:
            await engine.dispose()

    try:
        listed = asyncio.run(read())
    except DatabaseError as exc:
        return _fail(exc)
    rows = [("BUNDLE", "HOLDER", "UID", "CLAIMED", "QUEUES", "ARTIFACTS", "BINDINGS")]
    for item in listed:
        owner = item.owner
        rows.append(
            (
                item.bundle_name,
                "(unowned)"
                if owner is None
                else f"{owner.cluster_id}/{owner.namespace}/{owner.name}",
                "-" if owner is None else owner.uid,
                "-" if item.claimed_at is None else f"{item.claimed_at:%Y-%m-%dT%H:%M:%SZ}",
                ",".join(item.queues) or "-",
                str(item.artifacts),
                str(item.bindings),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    return 0


def _claims_release(args: argparse.Namespace) -> int:
    import asyncio
    import re

    from taskhandler_operator.db.claims_admin import Released, admin_release
    from taskhandler_operator.db.engine import DatabaseError, create_engine

    # spec.bundleName's rule (kube.spec, a layer above this one): letters, digits, ". _ -".
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,249}", args.bundle_name):
        print(f"error: {args.bundle_name!r} is not a bundle name", file=sys.stderr)
        return EXIT_USAGE
    url = _url(args)
    if url is None:
        return EXIT_USAGE

    async def release() -> Released:
        engine = create_engine(url)
        try:
            return await admin_release(
                engine, args.bundle_name, uid=args.uid, delete_rows=args.delete_rows
            )
        finally:
            await engine.dispose()

    try:
        done = asyncio.run(release())
    except DatabaseError as exc:
        return _fail(exc)
    name = args.bundle_name
    if done.claim is not None:
        print(f"released bundle name {name!r} from {done.claim.owner.describe()}")
    else:
        print(f"bundle name {name!r} had no claim")
    if done.rows is not None:
        rows = done.rows
        print(
            f"deleted {rows.bindings} bindings, {rows.artifacts} artifacts and "
            f"{rows.problems} problems of bundle {name!r}"
        )
    elif done.claim is not None:
        print("its rows stay, unowned: the next resource that claims the name adopts them")
    return 0 if done.claim is not None or done.rows is not None else EXIT_REFUSED

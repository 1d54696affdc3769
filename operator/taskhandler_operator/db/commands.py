"""``taskhandler-operator db ...``: schema upgrade and check.

Exit codes: 0 done, 1 refused or failed (the message says why: a malformed URL, a database
that does not exist, a refused login, a schema that does not fit), 2 usage error, 75
(``EX_TEMPFAIL``) only when retrying may help: the server could not be reached, or the
connection broke.
"""

from __future__ import annotations

import argparse
import sys

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

"""``taskhandler-operator db ...``: schema upgrade and check.

Exit codes: 0 done, 1 refused or failed (the message says why: a malformed URL, a database
that does not exist, a refused login, a schema that does not fit), 2 usage error, 75
(``EX_TEMPFAIL``) only when retrying may help: the server could not be reached, or the
connection broke.
"""

from __future__ import annotations

import argparse
import os
import sys

from taskhandler_operator.db import URL_ENV

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_TEMPFAIL = 75


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    db = subparsers.add_parser("db", help="the binding tables in Airflow's metadata database")
    db_commands = db.add_subparsers(dest="db_command", metavar="DB_COMMAND", required=True)

    url_help = f"SQLAlchemy URL of Airflow's PostgreSQL database (default: ${URL_ENV})"
    upgrade = db_commands.add_parser(
        "upgrade",
        help="create or adopt the binding tables and run the operator's migrations (idempotent)",
    )
    upgrade.add_argument("--url", help=url_help)
    upgrade.add_argument("--revision", default="head", help="target revision (default: head)")
    upgrade.set_defaults(func=_upgrade)

    check = db_commands.add_parser(
        "check", help="report whether the schema matches this operator version; changes nothing"
    )
    check.add_argument("--url", help=url_help)
    check.set_defaults(func=_check)


def _url(args: argparse.Namespace) -> str | None:
    url: str | None = args.url or os.environ.get(URL_ENV)
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
    if report.adopted:
        print(f"{report.database}: adopted existing {', '.join(report.adopted)}")
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

"""``taskhandler-operator crd`` and ``rbac``: print a generated file, or check the committed one.

``crd`` is the TaskHandlerBundle CRD (``crds/``, copied into the chart's ``files/``); ``rbac``
is the rules file the Helm chart renders its Roles from (``kube/rbac.py`` is the one source).

Exit codes: 0 printed / up to date, 1 the file differs or cannot be read (the message says
which and how to regenerate it).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from taskhandler_operator.inputfiles import InputError, read_text
from taskhandler_operator.kube.names import CRD_FILE
from taskhandler_operator.kube.rbac import RULES_FILE

EXIT_DRIFT = 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "crd",
        help="print the TaskHandlerBundle CustomResourceDefinition generated from the models",
        description=(
            "Print the CustomResourceDefinition (YAML) generated from the operator's pydantic "
            f"models; with --check, compare it with the committed file instead ({CRD_FILE})."
        ),
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if the file differs from what the models generate; print nothing else",
    )
    parser.add_argument(
        "--file",
        type=Path,
        default=Path(CRD_FILE),
        metavar="PATH",
        help=f"the file --check compares with (default: {CRD_FILE})",
    )
    parser.set_defaults(func=run)

    rbac = subparsers.add_parser(
        "rbac",
        help="print the operator's RBAC rules file the Helm chart renders its Roles from",
        description=(
            "Print the operator's RBAC rules (kube/rbac.py) as the YAML file the Helm chart "
            f"reads; with --check, compare it with the committed file instead ({RULES_FILE})."
        ),
    )
    rbac.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if the file differs from the rules; print nothing else",
    )
    rbac.add_argument(
        "--file",
        type=Path,
        default=Path(RULES_FILE),
        metavar="PATH",
        help=f"the file --check compares with (default: {RULES_FILE})",
    )
    rbac.set_defaults(func=run_rbac)


def run(args: argparse.Namespace) -> int:
    from taskhandler_operator.kube.crd import crd_yaml

    return _print_or_check(args, "crd", crd_yaml, "the models")


def run_rbac(args: argparse.Namespace) -> int:
    from taskhandler_operator.kube.rbac import rules_yaml

    return _print_or_check(args, "rbac", rules_yaml, "the rules in kube/rbac.py")


def _print_or_check(
    args: argparse.Namespace, command: str, generate: Callable[[], str], source: str
) -> int:
    text = generate()
    if not args.check:
        sys.stdout.write(text)
        return 0
    path: Path = args.file
    regenerate = f"regenerate it: taskhandler-operator {command} > {path}"
    try:
        committed = read_text(path)  # bounded: a FIFO or /dev/zero given as --file cannot hang
    except InputError as exc:
        print(f"error: {exc}; {regenerate}", file=sys.stderr)
        return EXIT_DRIFT
    if committed != text:
        print(f"error: {path} does not match {source}; {regenerate}", file=sys.stderr)
        return EXIT_DRIFT
    print(f"{path} matches {source}")
    return 0

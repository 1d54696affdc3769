"""``taskhandler-operator crd``: print the TaskHandlerBundle CRD, or check the committed file.

Exit codes: 0 printed / up to date, 1 the file differs or cannot be read (the message says
which and how to regenerate it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from taskhandler_operator.kube.names import CRD_FILE

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


def run(args: argparse.Namespace) -> int:
    from taskhandler_operator.kube.crd import crd_yaml

    text = crd_yaml()
    if not args.check:
        sys.stdout.write(text)
        return 0
    path: Path = args.file
    regenerate = f"regenerate it: taskhandler-operator crd > {path}"
    try:
        committed = path.read_text(encoding="utf-8")
    except OSError as exc:
        print(f"error: cannot read {path}: {exc.strerror or exc}; {regenerate}", file=sys.stderr)
        return EXIT_DRIFT
    if committed != text:
        print(f"error: {path} does not match the models; {regenerate}", file=sys.stderr)
        return EXIT_DRIFT
    print(f"{path} matches the models")
    return 0

"""Command-line entry point.

Each concern registers its own subcommands from a small ``commands`` module
(``artifacts.commands``, ``protocol.commands``, ``db.commands``) so that the
CLI grows without one file knowing every command's arguments. Heavy imports
happen inside the handlers, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from taskhandler_operator import __version__

# Modules that expose ``register(subparsers)``; each adds its subcommands and
# sets ``func`` on them (a callable taking the parsed namespace, returning an exit code).
COMMAND_MODULES: tuple[str, ...] = (
    "taskhandler_operator.artifacts.commands",
    "taskhandler_operator.protocol.commands",
    "taskhandler_operator.db.commands",
    "taskhandler_operator.kube.commands",
    "taskhandler_operator.sources.commands",
    "taskhandler_operator.controller.commands",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="taskhandler-operator",
        description=(
            "Bind Airflow @task.stub tasks to the Lang-SDK artifacts (Go executables, JARs, "
            ".min.mjs bundles) that implement them."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue  # concern not built yet
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 0
    code: int = func(args)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

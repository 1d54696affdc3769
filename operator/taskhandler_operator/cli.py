"""Command-line entry point.

Each concern registers its own subcommands from a small ``commands`` module
(``artifacts.commands``, ``protocol.commands``, ``db.commands``) so that the
CLI grows without one file knowing every command's arguments. Heavy imports
happen inside the handlers, so ``--help`` stays fast.

A named subcommand imports only the module that registers it (:data:`COMMANDS`): every probe
pod runs ``fetch`` and ``probe`` in a fresh interpreter, and neither should pay for the
operator's settings, database or Kubernetes imports (tests/unit/test_cli_imports.py).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

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
    "taskhandler_operator.controller.publication_commands",
)

# Which module registers each subcommand, so that ``taskhandler-operator probe ...`` imports
# ``protocol.commands`` alone. Anything else (no command, ``--help``, ``--version``, a typo)
# registers every module, so the top-level help and argparse's errors list all commands.
# tests/unit/test_cli.py checks this against what the modules register.
COMMANDS: dict[str, str] = {
    "inspect": "taskhandler_operator.artifacts.commands",
    "plan": "taskhandler_operator.artifacts.commands",
    "verify": "taskhandler_operator.artifacts.commands",
    "probe": "taskhandler_operator.protocol.commands",
    "db": "taskhandler_operator.db.commands",
    "crd": "taskhandler_operator.kube.commands",
    "rbac": "taskhandler_operator.kube.commands",
    "fetch": "taskhandler_operator.sources.commands",
    "sync": "taskhandler_operator.sources.commands",
    "check-artifact-server": "taskhandler_operator.sources.commands",
    "run": "taskhandler_operator.controller.commands",
    "diff": "taskhandler_operator.controller.publication_commands",
    "rollback": "taskhandler_operator.controller.publication_commands",
}

# The commands a probe pod runs (kube/probe_job.py), each in a fresh interpreter that ends with
# them: the console script skips the interpreter's teardown after these (console_main).
POD_COMMANDS: frozenset[str] = frozenset({"fetch", "probe"})


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser; with ``command`` (a name in :data:`COMMANDS`) only its module's."""
    parser = argparse.ArgumentParser(
        prog="taskhandler-operator",
        description=(
            "Bind Airflow @task.stub tasks to the Lang-SDK artifacts (Go executables, JARs, "
            ".min.mjs bundles) that implement them."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = (COMMANDS[command],) if command in COMMANDS else COMMAND_MODULES
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue  # concern not built yet
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 0
    code: int = func(args)
    return code


def console_main() -> NoReturn:
    """The ``taskhandler-operator`` console script (and ``python -m taskhandler_operator``).

    After a pod command the process ends with ``os._exit`` once stdout and stderr are flushed.
    Tearing down the 200-odd modules a probe imports (module by module, then the collector)
    took about 20 ms of each probe process, a sixth of its own cost (docs/operations.md), and
    neither command leaves work for that teardown: files are written and closed, the runtime's
    processes reaped, and the thread pools (whose exit hooks ``concurrent.futures`` registers)
    shut down before the command returns. An exception still takes the ordinary way out.
    """
    argv = sys.argv[1:]
    code = main(argv)
    if argv and argv[0] in POD_COMMANDS:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    console_main()

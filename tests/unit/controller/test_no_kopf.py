"""The runtime modules import no kopf: only the switchboard module does (DESIGN §5)."""

from __future__ import annotations

import subprocess
import sys

MODULES = (
    "backoff",
    "bundle",
    "commands",
    "health",
    "kubeapi",
    "leader",
    "logs",
    "metrics",
    "probing",
    "report",
    "runtime",
    "syncing",
)


def test_runtime_modules_do_not_import_kopf() -> None:
    imports = "; ".join(f"import taskhandler_operator.controller.{m}" for m in MODULES)
    check = f"{imports}; import sys; print('kopf' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"

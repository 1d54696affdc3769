"""An idle leader stays live: ``taskhandler-operator run`` with no TaskHandlerBundle at all,
every liveness limit made short (``THOP_LIVENESS_*``), polled on ``/healthz`` for longer than
every limit (real control plane, real PostgreSQL).

Before liveness was built on the loops themselves, the ``reconcilers`` heartbeat was beaten only
after a pass, so a leader with nothing to reconcile answered 503 once its limit (600 s, not
settable) passed, and the kubelet restarted it for good (docs/operator.md, liveness).
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from tests.e2e.operator_env import OPERATOR_USER, Operator, run_command

pytestmark = [pytest.mark.kube, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

LIMITS = {
    "THOP_LIVENESS_EVENT_LOOP_SECONDS": "2",
    "THOP_LIVENESS_ELECTION_SECONDS": "3",
    "THOP_LIVENESS_INVENTORY_SECONDS": "3",
    "THOP_LIVENESS_PASS_SECONDS": "2",
}
#: The inventory check never goes below two polls (15 s each), however short the setting.
EXPECTED = {"event-loop": 2.0, "leader-election": 3.0, "inventory": 30.0, "reconcilers": 2.0}


def healthz(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def ready(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:  # not listening yet
        return 0


def test_an_idle_leader_with_no_bundles_stays_live_past_every_limit(
    kube_cluster: KubeCluster, namespace: str, thb_crd: str, migrated: str, tmp_path: Path
) -> None:
    command = run_command(kube_cluster, OPERATOR_USER, [namespace], migrated, tmp_path, **LIMITS)
    log = tmp_path / "operator.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(command.argv, env=command.env, stdout=out, stderr=subprocess.STDOUT)
    op = Operator(proc, log, command.health_port)
    try:
        deadline = time.monotonic() + 120
        body: dict[str, Any] = {}
        # Ready once it leads; its checks arm as the loops they watch start, a moment later
        # (a CI run once read /healthz between the two): wait for both.
        while True:
            if ready(op.health_port) == 200:
                body = healthz(op.health_port)[1]
                if all(check["armed"] for check in body["heartbeats"].values()):
                    break
            assert proc.poll() is None, op.tail()
            assert time.monotonic() < deadline, (
                f"never became the ready leader with every check armed: {body}\n{op.tail()}"
            )
            time.sleep(0.5)
        limits = {name: check["maxAgeSeconds"] for name, check in body["heartbeats"].items()}
        assert limits == EXPECTED, body

        # Idle for longer than the longest limit, with margin: never stale.
        idle_until = time.monotonic() + max(EXPECTED.values()) + 10
        polls = 0
        while time.monotonic() < idle_until:
            status, body = healthz(op.health_port)
            assert status == 200, f"{body}\n{op.tail()}"
            polls += 1
            time.sleep(1.0)
        assert polls >= 30
        assert body["heartbeats"]["reconcilers"]["ageSeconds"] == 0.0  # no pass runs
        assert proc.poll() is None, op.tail()
    finally:
        op.stop()

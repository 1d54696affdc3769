"""The chart's operator left idle, with no TaskHandlerBundle, past every real liveness limit.

What it proves: the operator installed with helm from the chart (its own Deployment, with the
chart's startup, liveness and readiness probes run by the process node as a kubelet runs them)
stays live and Ready with nothing to do: after 15 minutes its pod shows ``RESTARTS 0``, the
liveness probe never failed (no ``Unhealthy`` Event) and ``/healthz`` names every check fresh.
Before liveness was built on the loops themselves, the ``reconcilers`` heartbeat went stale 600 s
after the last pass, so this pod was killed at about 11 minutes and then kept crash-looping.

How: ``helm install --wait`` (the startup and readiness probes gate ``--wait``), then nothing for
``THOP_IDLE_SECONDS`` (default 900: the old 600 s limit plus the probe's 3 x 20 s, with margin,
and the demo's "15 minutes idle"), polling the pod once a minute.

Run (about 18 minutes; ``chaos`` marker, so not in the default suite)::

    make chaos
    .venv/bin/pytest -m chaos tests/chaos/test_idle_operator.py
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from typing import Any

import pytest

from taskhandler_devenv.chart_install import CHART, HostPorts, process_node_values
from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.kubecluster.procs import free_port
from tests.integration.chart.test_install import (
    RELEASE,
    adopt_crd,
    apply,
    diagnostics,
    operator_pods,
)

IDLE_SECONDS = float(os.environ.get("THOP_IDLE_SECONDS", "900"))

pytestmark = [
    pytest.mark.kube,
    pytest.mark.integration,
    pytest.mark.chaos,
    pytest.mark.timeout(IDLE_SECONDS + 600),
]


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = pod.get("status", {}).get("containerStatuses") or [{}]
    return dict(statuses[0])


def test_an_idle_chart_operator_is_never_restarted(
    kube_cluster: KubeCluster, kube_namespace: str, pg_url: str
) -> None:
    namespace = kube_namespace
    kube_cluster.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "airflow-db", "namespace": namespace},
        "stringData": {"url": pg_url},
    }
    apply(kube_cluster, secret)
    ports = HostPorts(free_port(), free_port(), free_port())
    set_args = process_node_values(
        ports, database_secret="airflow-db", watch_namespaces=(namespace,)
    )
    adopt_crd(kube_cluster, namespace)
    installed = kube_cluster.helm(
        "install",
        RELEASE,
        str(CHART),
        "-n",
        namespace,
        *set_args,
        "--wait",
        "--timeout=5m",
        check=False,
        timeout=330,
    )
    try:
        assert installed.returncode == 0, (
            f"{installed.stderr}\n{diagnostics(kube_cluster, namespace)}"
        )
        (pod,) = operator_pods(kube_cluster, namespace)
        probes = pod["spec"]["containers"][0]
        assert {"startupProbe", "livenessProbe", "readinessProbe"} <= set(probes)
        name = pod["metadata"]["name"]
        started = time.monotonic()
        while time.monotonic() - started < IDLE_SECONDS:
            time.sleep(min(60.0, IDLE_SECONDS - (time.monotonic() - started) + 0.1))
            (pod,) = operator_pods(kube_cluster, namespace)
            status = _container(pod)
            minutes = (time.monotonic() - started) / 60
            assert pod["metadata"]["name"] == name and status.get("restartCount") == 0, (
                f"restarted after {minutes:.1f} min idle: {status}\n"
                f"{diagnostics(kube_cluster, namespace)}"
            )
            assert status.get("ready") is True, f"{status}\n{diagnostics(kube_cluster, namespace)}"
        listing = kube_cluster.kubectl(
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            f"involvedObject.name={name}",
            "-o",
            "json",
        )
        events = [(e["reason"], e.get("message", "")) for e in json.loads(listing.stdout)["items"]]
        # Startup and readiness failures while it starts and takes the Lease are normal.
        assert not [e for e in events if e[0] == "Killing" or "Liveness" in e[1]], events
        with urllib.request.urlopen(f"http://127.0.0.1:{ports.health}/healthz", timeout=5) as r:
            body = json.loads(r.read())
        assert body["status"] == "ok" and all(c["ok"] for c in body["heartbeats"].values())
        shown = kube_cluster.kubectl("get", "pod", name, "-n", namespace).stdout
        restarts = shown.splitlines()[1].split()[3]
        assert restarts == "0", shown  # the RESTARTS column of kubectl get pods
    finally:
        kube_cluster.helm("uninstall", RELEASE, "-n", namespace, "--wait", check=False)

"""``taskhandler-operator run`` as a host process against the test control plane, and what it
needs there: a namespace prepared as the chart prepares probe namespaces (restricted Pod
Security, the probe account, the operator's namespaced RBAC bound to a user), the process itself
(start, kill, stop, its log), the reconcile-now request, and a bounded poll.

The operator e2e tests, the chaos tests and the operator benchmark build on these, each adding
only what it measures or asserts.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_operator.kube import names
from taskhandler_operator.kube.rbac import operator_rbac, probe_service_account, user_subject

T = TypeVar("T")


def apply_all(cluster: KubeCluster, objs: Iterable[Mapping[str, Any]]) -> None:
    """``kubectl apply`` of ``objs`` in one call (a v1 List); nothing when there are none."""
    items = list(objs)
    if items:
        document = {"apiVersion": "v1", "kind": "List", "items": items}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(document), timeout=600)


def prepare_operator_namespace(cluster: KubeCluster, namespace: str, user: str) -> None:
    """The existing ``namespace`` as the chart's probe namespaces: restricted Pod Security, the
    probe account, the operator's namespaced RBAC bound to ``user`` (whose kubeconfig
    ``cluster.user_kubeconfig(user)`` the operator then runs with)."""
    cluster.kubectl(
        "label",
        "namespace",
        namespace,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )
    rbac = operator_rbac(
        namespace=namespace,
        subject=user_subject(user),
        mode="namespaced",
        watch_namespaces=[namespace],
        name=f"thop-{namespace}",
    )
    apply_all(cluster, [probe_service_account(namespace), *rbac])


def request_reconcile(cluster: KubeCluster, namespace: str, name: str, token: str) -> None:
    """Ask for a pass of bundle ``name`` now: the reconcile-requested-at annotation set to
    ``token`` (a pass that handled it reports it as ``status.lastHandledReconcileAt``)."""
    cluster.kubectl(
        "annotate",
        "thb",
        name,
        "-n",
        namespace,
        "--overwrite",
        f"{names.ANNOTATION_RECONCILE_REQUESTED_AT}={token}",
    )


@dataclass
class OperatorReplica:
    """One ``run`` process; ``start`` again starts it anew with the same settings, each start
    logging to its own file (``<log>.<n>.log``) so a restart never loses the earlier log."""

    argv: list[str]
    env: dict[str, str]
    log: Path
    stop_timeout: float = 30
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    logs: list[Path] = field(default_factory=list)

    def start(self) -> OperatorReplica:
        self.starts += 1
        path = self.log.with_suffix(f".{self.starts}.log")
        self.logs.append(path)
        with path.open("wb") as out:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.logs if p.exists())

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.text().splitlines()[-lines:])

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def terminate(self, timeout: float = 60) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``stop_timeout`` seconds; nothing if it is not running."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(self.stop_timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def poll_until(what: str, check: Callable[[], T | None], timeout: float, poll: float = 1.0) -> T:
    """Call ``check`` every ``poll`` seconds until it returns something truthy and return that;
    :class:`TimeoutError` naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(poll)

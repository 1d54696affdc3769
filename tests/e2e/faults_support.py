"""Helpers of the operator fault tests: start/kill ``taskhandler-operator run`` replicas, read a
bundle's status, list probe Jobs with their uids, snapshot the operator's rows."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa

from taskhandler_operator.db.tables import ARTIFACT_TABLE, BINDING_TABLE, PROBLEM_TABLE
from taskhandler_operator.devenv.kubecluster.control_plane import KubeCluster
from taskhandler_operator.kube import names
from tests.e2e.operator_env import events as bundle_events
from tests.e2e.operator_env import get_bundle, run_command

T = TypeVar("T")


@dataclass
class Replica:
    """One ``run`` process; ``restart`` starts it again with the same settings."""

    argv: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    logs: list[Path] = field(default_factory=list)

    def start(self) -> Replica:
        self.starts += 1
        path = self.log.with_suffix(f".{self.starts}.log")
        self.logs.append(path)
        with path.open("wb") as out:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        return self

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
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def replica(
    cluster: KubeCluster,
    user: str,
    namespace: str,
    database: str,
    workdir: Path,
    name: str,
    **extra: str,
) -> Replica:
    """A replica under ``user``'s identity; replicas of one workdir share the revision store
    and the signing key file (as the pods of one Deployment share the chart's Secret)."""
    key = workdir / "signingKey"
    if not key.exists():
        key.write_text(os.urandom(32).hex())
    command = run_command(
        cluster, user, [namespace], database, workdir, THOP_SIGNING_KEY_FILE=str(key), **extra
    )
    return Replica(command.argv, command.env, workdir / f"operator-{name}")


def wait_for(
    what: str,
    check: Callable[[], T | None],
    timeout: float,
    *,
    more: Callable[[], str] = lambda: "",
) -> T:
    """Poll ``check`` every second until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}\n{more()}")
        time.sleep(1)


def thb(cluster: KubeCluster, namespace: str, name: str) -> dict[str, Any]:
    return get_bundle(cluster, namespace, name)


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return {}


def jobs_by_name(cluster: KubeCluster, namespace: str) -> dict[str, str]:
    """The probe Jobs, name -> uid (a Job deleted and created again has a new uid)."""
    out = cluster.kubectl(
        "get",
        "jobs",
        "-n",
        namespace,
        "-l",
        f"{names.LABEL_MANAGED_BY}={names.MANAGER}",
        "-o",
        "json",
    )
    items = json.loads(out.stdout)["items"]
    return {i["metadata"]["name"]: i["metadata"]["uid"] for i in items}


def events(cluster: KubeCluster, namespace: str, name: str) -> list[str]:
    """The reasons of the operator's Events about the bundle."""
    return [e["reason"] for e in bundle_events(cluster, namespace, name)]


def reconcile_now(cluster: KubeCluster, namespace: str, name: str, token: str) -> None:
    cluster.kubectl(
        "annotate",
        "thb",
        name,
        "-n",
        namespace,
        "--overwrite",
        f"{names.ANNOTATION_RECONCILE_REQUESTED_AT}={token}",
    )


def rows(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """The operator's rows in a form that does not depend on when or how often they were
    written: bindings with their artifact, artifacts with their answer, problems."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            bindings = conn.execute(
                sa.text(
                    f"SELECT b.dag_id, b.task_id, a.bundle_name, a.relative_fileloc, a.size_bytes "
                    f"FROM {BINDING_TABLE} b JOIN {ARTIFACT_TABLE} a ON a.id = b.artifact_id "
                    "ORDER BY 1, 2, 3, 4"
                )
            ).all()
            artifacts = conn.execute(
                sa.text(
                    f"SELECT bundle_name, relative_fileloc, size_bytes, cache_digest, "
                    f"task_handlers::text FROM {ARTIFACT_TABLE} ORDER BY 1, 2"
                )
            ).all()
            problems = conn.execute(
                sa.text(f"SELECT bundle_name, message FROM {PROBLEM_TABLE} ORDER BY 1, 2")
            ).all()
    finally:
        engine.dispose()
    return {
        "bindings": [tuple(r) for r in bindings],
        "artifacts": [tuple(r) for r in artifacts],
        "problems": [tuple(r) for r in problems],
    }

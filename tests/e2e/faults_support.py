"""Helpers of the operator fault tests: ``taskhandler-operator run`` replicas (the process is
:class:`~taskhandler_devenv.operator_process.OperatorReplica`), a bundle's status, probe
Jobs with their uids, the operator's rows in a comparable form."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.operator_process import OperatorReplica as Replica
from taskhandler_devenv.operator_process import poll_until
from taskhandler_operator.db.tables import ARTIFACT_TABLE, BINDING_TABLE, PROBLEM_TABLE
from taskhandler_operator.kube import names
from tests.e2e.operator_env import events as bundle_events
from tests.e2e.operator_env import get_bundle, run_command

T = TypeVar("T")


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
    try:
        return poll_until(what, check, timeout)
    except TimeoutError as exc:
        pytest.fail(f"{exc}\n{more()}")


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

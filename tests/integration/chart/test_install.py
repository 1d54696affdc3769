"""The chart installed with the real helm into the real control plane, in a namespace with Pod
Security ``restricted`` enforced.

The pre-install hook Job migrates the test PostgreSQL (URL from a Secret), the operator runs on
the process node from the chart's own Deployment (command, args, env, Secret and emptyDir
volumes, the projected service-account token it logs in with), a Go bundle served from a git
repository over HTTP becomes Ready, ``helm upgrade`` with a changed value rolls the operator
and keeps the bindings, ``helm uninstall`` removes the operator but keeps the CRD and the bundle.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from taskhandler_devenv.chart_install import (
    CHART,
    HostPorts,
    adopt_crd_commands,
    process_node_values,
)
from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.kubecluster.procs import free_port
from taskhandler_devenv.serialized_dags import dag_document, insert_dag, stub_task
from taskhandler_operator.db.engine import create_engine
from taskhandler_operator.db.tables import ARTIFACT_TABLE, BINDING_TABLE
from taskhandler_operator.kube import names
from taskhandler_operator.records import TaskHandlerArtifactRef
from taskhandler_operator.scheduler import resolve_task_handlers
from tests.fixtures.runtimes_plugin import RuntimeFactory
from tests.fixtures.sources import HTTP_USER, PLANTED_PASSWORD, GitRepo, HttpServer

pytestmark = [pytest.mark.kube, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

RELEASE = "thop"
DEPLOYMENT = "thop-taskhandler-operator"
DAG, TASK = "orders_etl", "extract"


def apply(cluster: KubeCluster, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))


def get_json(cluster: KubeCluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def operator_pods(cluster: KubeCluster, namespace: str) -> list[dict[str, Any]]:
    selector = "app.kubernetes.io/name=taskhandler-operator,app.kubernetes.io/component=operator"
    pods: list[dict[str, Any]] = get_json(cluster, "pods", "-n", namespace, "-l", selector)["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def adopt_crd(cluster: KubeCluster, namespace: str) -> None:
    """Other tests of the session apply the CRD with kubectl: adopt it into the release."""
    if cluster.kubectl("get", "crd", names.CRD_NAME, check=False).returncode == 0:
        for args in adopt_crd_commands(names.CRD_NAME, RELEASE, namespace):
            cluster.kubectl(*args)


def resolve(url: str) -> TaskHandlerArtifactRef | None:
    async def run() -> TaskHandlerArtifactRef | None:
        engine = create_engine(url)
        try:
            return dict(await resolve_task_handlers(engine, [(DAG, TASK)]))[(DAG, TASK)]
        finally:
            await engine.dispose()

    return asyncio.run(run())


def diagnostics(cluster: KubeCluster, namespace: str) -> str:
    parts = [
        cluster.kubectl("get", "all,thb,events", "-n", namespace, check=False).stdout[-4000:],
    ]
    for pod in operator_pods(cluster, namespace):
        logs = cluster.kubectl(
            "logs", pod["metadata"]["name"], "-n", namespace, "--tail=60", check=False
        )
        parts.append(logs.stdout + logs.stderr)
    return "\n".join(parts)


@pytest.fixture
def namespace(kube_cluster: KubeCluster, kube_namespace: str, pg_url: str) -> str:
    """Restricted Pod Security, the database Secret, the git Secret and Airflow's Dag."""
    kube_cluster.kubectl(
        "label",
        "namespace",
        kube_namespace,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )
    for name, data in (
        ("airflow-db", {"url": pg_url}),
        ("git-auth", {"username": HTTP_USER, "password": PLANTED_PASSWORD}),
    ):
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": kube_namespace},
            "stringData": data,
        }
        apply(kube_cluster, secret)
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        insert_dag(conn, dag_document(DAG, [stub_task(TASK, queue="go")]))
    engine.dispose()
    return kube_namespace


@pytest.fixture
def repo(git_repo: GitRepo, runtime_factory: RuntimeFactory) -> GitRepo:
    spec = {DAG: [{"task_id": TASK, "binding": "named", "params": []}]}
    git_repo.commit({"go/extract": Path(runtime_factory("go", spec=spec)).read_bytes()}, "go")
    (git_repo.work / "go" / "extract").chmod(0o755)
    git_repo.commit({}, "executable")
    return git_repo


def test_helm_install_upgrade_uninstall(
    kube_cluster: KubeCluster,
    namespace: str,
    pg_url: str,
    repo: GitRepo,
    source_http: HttpServer,
) -> None:
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
        _after_install(kube_cluster, namespace, pg_url, repo, source_http)
    finally:
        kube_cluster.helm("uninstall", RELEASE, "-n", namespace, "--wait", check=False)


def _after_install(
    cluster: KubeCluster, namespace: str, pg_url: str, repo: GitRepo, source_http: HttpServer
) -> None:
    # The hook Job migrated the database: the operator's tables exist.
    engine = sa.create_engine(pg_url)
    with engine.connect() as conn:
        tables = set(sa.inspect(conn).get_table_names())
    engine.dispose()
    assert {ARTIFACT_TABLE, BINDING_TABLE} <= tables, sorted(tables)

    # The operator pod runs the chart's own command and arguments under restricted.
    (pod,) = operator_pods(cluster, namespace)
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["taskhandler-operator"]
    assert container["args"] == ["run"]
    assert pod["status"]["phase"] == "Running", diagnostics(cluster, namespace)
    first_uid = pod["metadata"]["uid"]

    bundle = {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {"name": "orders-go", "namespace": namespace},
        "spec": {
            "bundleName": "orders-go",
            "language": "go",
            "queues": ["go"],
            "source": {
                "git": {
                    "url": repo.http_url(source_http),
                    "ref": "main",
                    "path": "go",
                    "secretRef": {"name": "git-auth"},
                }
            },
            "interval": "1h",
            "probe": {"timeout": "1m"},
        },
    }
    apply(cluster, bundle)
    wait_ready(cluster, namespace)
    ref = resolve(pg_url)
    assert ref is not None and ref.bundle_info is not None, ref
    assert ref.bundle_info.name == "orders-go"

    helm_test(cluster, namespace)

    # A changed value rolls the operator (Recreate) and the bindings stay.
    upgraded = cluster.helm(
        "upgrade",
        RELEASE,
        str(CHART),
        "-n",
        namespace,
        "--reuse-values",
        "--set",
        "logging.level=debug",
        "--wait",
        "--timeout=5m",
        check=False,
        timeout=330,
    )
    assert upgraded.returncode == 0, f"{upgraded.stderr}\n{diagnostics(cluster, namespace)}"
    (pod,) = operator_pods(cluster, namespace)
    assert pod["metadata"]["uid"] != first_uid
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["THOP_LOG_LEVEL"] == "debug"
    wait_ready(cluster, namespace)
    after = resolve(pg_url)
    assert after is not None and after.bundle_info is not None, after
    assert (after.bundle_info.name, after.rel_path) == ("orders-go", ref.rel_path)

    # Uninstall: the operator goes, the CRD (crds.keep) and the user's bundle stay.
    cluster.helm("uninstall", RELEASE, "-n", namespace, "--wait", "--timeout=2m")
    gone = cluster.kubectl("get", "deployment", DEPLOYMENT, "-n", namespace, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr, gone.stdout
    cluster.kubectl("get", "crd", names.CRD_NAME)
    kept = get_json(cluster, "thb", "orders-go", "-n", namespace)
    assert kept["spec"]["bundleName"] == "orders-go"


def helm_test(cluster: KubeCluster, namespace: str) -> None:
    """``helm test``: its Pod (restricted, no token) checks the database and fetches a signed
    URL from the artifact server. With another key in the signing-key Secret than the one the
    running operator signs with, the same test fails and says so."""

    def run(*args: str) -> Any:
        return cluster.helm(
            "test", RELEASE, "-n", namespace, "--timeout=3m", *args, check=False, timeout=200
        )

    # A passed test Pod is deleted at once (hook-succeeded), so no --logs here: the artifact
    # server's own log shows the two requests it answered.
    passed = run()
    assert passed.returncode == 0, (
        f"{passed.stdout}{passed.stderr}\n{diagnostics(cluster, namespace)}"
    )
    suite = rf"TEST SUITE:\s+{DEPLOYMENT}-test\n(.*\n)*?Phase:\s+Succeeded"
    assert re.search(suite, passed.stdout), passed.stdout
    (pod,) = operator_pods(cluster, namespace)
    log = cluster.kubectl("logs", pod["metadata"]["name"], "-n", namespace).stdout
    for verdict in ("missing", "tampered"):
        assert re.search(
            rf"artifact request refused \({verdict}\): /v1/artifacts/thop-check/signing-check/",
            log,
        ), log[-3000:]

    secret = f"{DEPLOYMENT}-signing-key"
    original = get_json(cluster, "secret", secret, "-n", namespace)["data"]["key"]
    other = base64.b64encode(b"another-key-" + b"0" * 40).decode()
    patch = {"data": {"key": other}}
    cluster.kubectl("patch", "secret", secret, "-n", namespace, "-p", json.dumps(patch))
    try:
        failed = run("--logs")  # a failed test Pod is kept: its log says why
    finally:
        patch = {"data": {"key": original}}
        cluster.kubectl("patch", "secret", secret, "-n", namespace, "-p", json.dumps(patch))
    assert failed.returncode != 0, failed.stdout
    assert re.search(r"Phase:\s+Failed", failed.stdout), failed.stdout
    assert "refused a URL signed with the mounted key (403 tampered)" in (
        failed.stdout + failed.stderr
    ), failed.stdout + failed.stderr
    cluster.kubectl("delete", "pod", f"{DEPLOYMENT}-test", "-n", namespace, "--wait=false")


def wait_ready(cluster: KubeCluster, namespace: str) -> None:
    done = cluster.kubectl(
        "wait",
        "--for=condition=Ready",
        "thb/orders-go",
        "-n",
        namespace,
        "--timeout=240s",
        check=False,
        timeout=260,
    )
    if done.returncode != 0:
        pytest.fail(f"orders-go not Ready: {done.stderr}\n{diagnostics(cluster, namespace)}")


def test_a_shard_runs_beside_the_default_one(
    kube_cluster: KubeCluster, namespace: str, pg_url: str
) -> None:
    """``shards: [{name: b}]``: both Deployments' pods run and each leads its own Lease (two
    Leases, held by different pods), and each Service selects only its own shard's pod. The
    process node shares the host's network, so the shard gets its own host ports (and the
    artifact URL on them); in a cluster it needs neither."""
    ports = HostPorts(free_port(), free_port(), free_port())
    shard_ports = HostPorts(free_port(), free_port(), free_port())
    set_args = process_node_values(
        ports,
        database_secret="airflow-db",
        watch_namespaces=(namespace,),
        extra=(
            "shards[0].name=b",
            f"shards[0].ports.artifactServer={shard_ports.artifact_server}",
            f"shards[0].ports.metrics={shard_ports.metrics}",
            f"shards[0].ports.health={shard_ports.health}",
            f"shards[0].artifactServer.url=http://127.0.0.1:{shard_ports.artifact_server}",
        ),
    )
    adopt_crd(kube_cluster, namespace)
    installed = kube_cluster.helm(
        "install", RELEASE, str(CHART), "-n", namespace, *set_args,
        "--wait", "--timeout=5m", check=False, timeout=330,
    )  # fmt: skip
    try:
        assert installed.returncode == 0, (
            f"{installed.stderr}\n{diagnostics(kube_cluster, namespace)}"
        )
        _both_shards_lead(kube_cluster, namespace)
    finally:
        kube_cluster.helm("uninstall", RELEASE, "-n", namespace, "--wait", check=False)


def _both_shards_lead(cluster: KubeCluster, namespace: str) -> None:
    shard_name = f"{DEPLOYMENT}-b"
    pods: dict[str, str] = {}  # Deployment -> its one pod
    for deployment in (DEPLOYMENT, shard_name):
        spec = get_json(cluster, "deployment", deployment, "-n", namespace)["spec"]
        selector = ",".join(f"{k}={v}" for k, v in spec["selector"]["matchLabels"].items())
        items = get_json(cluster, "pods", "-n", namespace, "-l", selector)["items"]
        running = [p for p in items if not p["metadata"].get("deletionTimestamp")]
        assert len(running) == 1, (deployment, [p["metadata"]["name"] for p in items])
        assert running[0]["status"]["phase"] == "Running", diagnostics(cluster, namespace)
        pods[deployment] = running[0]["metadata"]["name"]
    env = {
        e["name"]: e.get("value")
        for e in get_json(cluster, "pod", pods[shard_name], "-n", namespace)["spec"]["containers"][
            0
        ]["env"]
    }
    assert env["THOP_SHARD"] == "b"

    # Two Leases, each held by the pod of its own shard (its log names the holder identity).
    leases = {
        lease["metadata"]["name"]: lease["spec"].get("holderIdentity") or ""
        for lease in get_json(cluster, "leases", "-n", namespace)["items"]
    }
    holders = {
        DEPLOYMENT: leases.get("taskhandler-operator", ""),
        shard_name: leases.get("taskhandler-operator-b", ""),
    }
    assert all(holders.values()) and len(set(holders.values())) == 2, leases
    for deployment, lease in (
        (DEPLOYMENT, "taskhandler-operator"),
        (shard_name, "taskhandler-operator-b"),
    ):
        log = cluster.kubectl("logs", pods[deployment], "-n", namespace).stdout
        led = f"leader election: {holders[deployment]} leads (Lease {namespace}/{lease})"
        assert led in log, (deployment, lease, log[-3000:])

    # Each Service's selector, as the endpoints controller applies it, finds only its own
    # shard's pod (the test control plane runs no endpoints controller).
    for deployment, pod in pods.items():
        service = get_json(cluster, "service", deployment, "-n", namespace)
        selector = ",".join(f"{k}={v}" for k, v in service["spec"]["selector"].items())
        selected = get_json(cluster, "pods", "-n", namespace, "-l", selector)["items"]
        assert [p["metadata"]["name"] for p in selected] == [pod], (deployment, selector)

"""The chart on the real node, end to end (issue 26; docs/testing-kubernetes.md, "Real node").

The images built from ``images/Dockerfile`` (``taskhandler_devenv.images.build_images``) are
imported into the real kubelet's containerd and the chart is installed with the real helm into a
namespace with Pod Security ``restricted`` enforced, ``imagePullPolicy: Never``. What the process
node never enforced is real here: UID 65532, read-only root, no capabilities, memory limits, the
liveness/readiness/startup probes, restarts by the kubelet.

The pods reach the test's loopback servers through ``taskhandler_devenv.realnode_install``: the
session PostgreSQL (``pg_hba.conf`` lets the pod subnet in, restored after) and the git/HTTP
source at fixed virtual addresses, the operator's artifact server (for the probe pods) at another.

The tests share one release and run in this order: install and stay up; a Go bundle probed in a
Job; a Java and a TypeScript bundle probed in Jobs of the runtime images; a probe over its memory
limit; the operator killed and restarted by the kubelet with no
duplicate Job; ``helm uninstall``.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from taskhandler_devenv.chart_install import CHART, adopt_crd_commands
from taskhandler_devenv.git_server import GitRepo, HttpServer, make_repo
from taskhandler_devenv.images import app_version, build_images
from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.postgres import PostgresServer
from taskhandler_devenv.realnode_install import (
    ARTIFACT_IP,
    IMAGE_REVISION,
    LOCAL_IMAGES,
    POSTGRES_IP,
    SOURCES_IP,
    Exposure,
    Forward,
    pods_may_connect,
    real_node_values,
)
from taskhandler_devenv.serialized_dags import dag_document, insert_dag, stub_task
from taskhandler_operator.db.tables import ARTIFACT_TABLE, BINDING_TABLE
from taskhandler_operator.kube import names
from tests.e2e.operator_env import bindings
from tests.fixtures.realnode import RealNodeWorld, report
from tests.fixtures.runtimes_plugin import RuntimeFactory
from tests.fixtures.sources import HTTP_USER, PLANTED_PASSWORD

pytestmark = [
    pytest.mark.kube,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

RELEASE = "thop"
DEPLOYMENT = "thop-taskhandler-operator"
NODE = "thop-real-node"
ARTIFACT_PORT = 8090
OPERATOR_SELECTOR = (
    "app.kubernetes.io/name=taskhandler-operator,app.kubernetes.io/component=operator"
)
DAG = "orders_etl"
STABLE_SECONDS = 60.0
WAIT_SECONDS = 240.0


@dataclass
class Release:
    cluster: KubeCluster
    namespace: str
    db_url: str
    source: HttpServer
    repo: GitRepo
    exposure: Exposure
    seconds_to_available: float
    installed: bool = True
    notes: list[str] = field(default_factory=list)

    def kubectl(self, *args: str, check: bool = True) -> Any:
        return self.cluster.kubectl(*args, "-n", self.namespace, check=check)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, obj: dict[str, Any]) -> None:
        self.cluster.kubectl("apply", "-n", self.namespace, "-f", "-", input=json.dumps(obj))

    def operator_pod(self) -> dict[str, Any]:
        pods = [
            p
            for p in self.get("pods", "-l", OPERATOR_SELECTOR)["items"]
            if not p["metadata"].get("deletionTimestamp")
        ]
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        return dict(pods[0])

    def git_url(self) -> str:
        # The pods reach the loopback source server at its virtual address.
        return self.repo.http_url(self.source).replace("127.0.0.1", SOURCES_IP)

    def diagnostics(self) -> str:
        parts = [self.kubectl("get", "all,thb,events", check=False).stdout[-5000:]]
        for pod in self.get("pods")["items"]:
            name = pod["metadata"]["name"]
            for args in (("--all-containers",), ("--all-containers", "--previous")):
                out = self.kubectl("logs", name, *args, "--tail=40", check=False)
                parts.append(f"--- {name} {' '.join(args)}\n{out.stdout}{out.stderr}")
        return "\n".join(parts)


def wait_for(what: str, check: Callable[[], bool], release: Release, timeout: float) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            pytest.fail(f"not {what} in {timeout:g}s\n{release.diagnostics()}", pytrace=False)
        time.sleep(1)
    return time.monotonic() - started


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


def operator_status(pod: dict[str, Any]) -> dict[str, Any]:
    (status,) = pod["status"].get("containerStatuses") or [{}]
    return dict(status)


def bundle(
    name: str,
    url: str,
    path: str,
    queue: str,
    probe: dict[str, Any] | None = None,
    language: str = "go",
) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {"name": name},
        "spec": {
            "bundleName": name,
            "language": language,
            "queues": [queue],
            "source": {
                "git": {"url": url, "ref": "main", "path": path, "secretRef": {"name": "git-auth"}}
            },
            "interval": "1h",
            "probe": {"timeout": "2m", **(probe or {})},
        },
    }


def probe_jobs(release: Release, bundle_name: str) -> set[str]:
    selector = f"{names.LABEL_MANAGED_BY}={names.MANAGER},{names.LABEL_BUNDLE}={bundle_name}"
    return {j["metadata"]["name"] for j in release.get("jobs", "-l", selector)["items"]}


@pytest.fixture(scope="module")
def real_images(real_node_world: RealNodeWorld) -> dict[str, Path]:
    """The project's images, built (cached by content) and imported into the node."""
    cluster = real_node_world.ensure_started()
    node = cluster.real_node
    assert node is not None
    started = time.monotonic()
    # A fixed revision label: a commit that changes no image input does not rebuild them.
    archives = build_images(revision=IMAGE_REVISION)
    for archive in archives.values():
        node.import_image(archive)
    report(
        f"chart on real node: images built/cached and imported in {time.monotonic() - started:.1f}s"
    )
    return archives


@pytest.fixture(scope="module")
def release(
    real_node_world: RealNodeWorld,
    real_images: dict[str, Path],
    pg_server: PostgresServer,
    airflow_template: str,
    source_http: HttpServer,
    runtime_factory: RuntimeFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Release]:
    cluster = real_node_world.ensure_started()
    namespace = f"chart-{uuid.uuid4().hex[:6]}"
    database = f"thop_real_{uuid.uuid4().hex[:8]}"
    pg_server.create_database(database, template=airflow_template)
    db_url = pg_server.url(database)
    engine = sa.create_engine(db_url)
    with engine.begin() as conn:
        stubs = [
            stub_task("extract", queue="go"),
            stub_task("load", queue="go-load"),
            stub_task("transform", queue="java"),
            stub_task("publish", queue="typescript"),
        ]
        insert_dag(conn, dag_document(DAG, stubs))
    engine.dispose()

    repo = make_repo(
        source_http.root / "git", f"repo-{uuid.uuid4().hex[:6]}", tmp_path_factory.mktemp("work")
    )

    def spec(task: str) -> dict[str, Any]:
        return {DAG: [{"task_id": task, "binding": "named", "params": []}]}

    def built(language: str, task: str) -> bytes:
        return Path(runtime_factory(language, spec=spec(task))).read_bytes()

    repo.commit(
        {
            "go/extract": built("go", "extract"),
            "go-load/load": built("go", "load"),
            "java/transform.jar": built("java", "transform"),
            "typescript/publish.min.mjs": built("typescript", "publish"),
        },
        "go, java and typescript bundles",
    )
    (repo.work / "go" / "extract").chmod(0o755)
    (repo.work / "go-load" / "load").chmod(0o755)
    repo.commit({}, "executable")

    exposure = Exposure()
    with pods_may_connect(pg_server):
        try:
            exposure.add(Forward(POSTGRES_IP, 5432, "127.0.0.1", pg_server.port))
            exposure.add(Forward(SOURCES_IP, source_http.port, "127.0.0.1", source_http.port))
            pod_db_url = db_url.replace(
                f"@{pg_server.host}:{pg_server.port}/", f"@{POSTGRES_IP}:5432/"
            )
            _prepare_namespace(cluster, namespace, pod_db_url)
            if cluster.kubectl("get", "crd", names.CRD_NAME, check=False).returncode == 0:
                for args in adopt_crd_commands(names.CRD_NAME, RELEASE, namespace):
                    cluster.kubectl(*args)
            values = real_node_values(
                app_version(),
                database_secret="airflow-db",
                artifact_url=f"http://{ARTIFACT_IP}:{ARTIFACT_PORT}",
                watch_namespaces=(namespace,),
            )
            started = time.monotonic()
            installed = cluster.helm(
                "install", RELEASE, str(CHART), "-n", namespace, *values,
                "--wait", "--timeout=5m", check=False, timeout=330,
            )  # fmt: skip
            elapsed = time.monotonic() - started
            rel = Release(
                cluster, namespace, db_url, source_http, repo, exposure, elapsed,
                installed=installed.returncode == 0,
            )  # fmt: skip
            if installed.returncode != 0:
                pytest.fail(f"helm install: {installed.stderr}\n{rel.diagnostics()}", pytrace=False)
            report(f"chart on real node: helm install --wait (hook Job + Available) {elapsed:.1f}s")
            pod_ip = rel.operator_pod()["status"]["podIP"]
            exposure.add(Forward(ARTIFACT_IP, ARTIFACT_PORT, pod_ip, ARTIFACT_PORT))
            yield rel
        finally:
            if cluster.helm("status", RELEASE, "-n", namespace, check=False).returncode == 0:
                cluster.helm("uninstall", RELEASE, "-n", namespace, "--wait", check=False)
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
            exposure.close()
            pg_server.drop_database(database)


def _prepare_namespace(cluster: KubeCluster, namespace: str, db_url: str) -> None:
    manifests: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": namespace,
                "labels": {
                    "pod-security.kubernetes.io/enforce": "restricted",
                    "pod-security.kubernetes.io/enforce-version": "latest",
                },
            },
        },
        *(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name, "namespace": namespace},
                "stringData": data,
            }
            for name, data in (
                ("airflow-db", {"url": db_url}),
                ("git-auth", {"username": HTTP_USER, "password": PLANTED_PASSWORD}),
            )
        ),
    ]
    for manifest in manifests:
        cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))


def test_install_restricted_operator_available_and_not_restarted(release: Release) -> None:
    # The hook Job migrated the database (it is deleted once it succeeded).
    engine = sa.create_engine(release.db_url)
    with engine.connect() as conn:
        tables = set(sa.inspect(conn).get_table_names())
    engine.dispose()
    assert {ARTIFACT_TABLE, BINDING_TABLE} <= tables, sorted(tables)
    assert release.get("jobs", "-l", "app.kubernetes.io/component=db-upgrade")["items"] == []

    deployment = release.get("deployment", DEPLOYMENT)
    assert condition(deployment, "Available").get("status") == "True"
    pod = release.operator_pod()
    assert pod["spec"]["nodeName"] == NODE
    (container,) = pod["spec"]["containers"]
    assert container["image"].startswith("localhost/taskhandler-operator:")
    assert container["imagePullPolicy"] == "Never"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert probe in container, probe
    assert container["securityContext"]["readOnlyRootFilesystem"] is True

    # The chart's probes keep a healthy operator up: no restart for a while.
    started = time.monotonic()
    while time.monotonic() - started < STABLE_SECONDS:
        status = operator_status(release.operator_pod())
        assert status.get("restartCount") == 0, (status, release.diagnostics())
        time.sleep(5)
    status = operator_status(release.operator_pod())
    assert status["ready"] is True, release.diagnostics()
    assert status["restartCount"] == 0, release.diagnostics()


def test_go_bundle_probed_in_a_job_on_the_real_node(release: Release) -> None:
    started = time.monotonic()
    release.apply(bundle("orders-go", release.git_url(), "go", "go"))
    wait_for(
        "orders-go Ready",
        lambda: condition(release.get("thb", "orders-go"), "Ready").get("status") == "True",
        release,
        WAIT_SECONDS,
    )
    report(f"chart on real node: Go bundle applied to Ready {time.monotonic() - started:.1f}s")
    assert bindings(release.db_url, "orders-go") == {(DAG, "extract"): "extract"}
    (job,) = probe_jobs(release, "orders-go")
    pods = release.get("pods", "-l", f"job-name={job}")["items"]
    assert pods, f"the probe Job {job} left no pod"
    spec = pods[0]["spec"]
    assert spec["nodeName"] == NODE
    assert spec.get("automountServiceAccountToken") is False
    for c in spec["containers"] + spec.get("initContainers", []):
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_java_and_typescript_bundles_probed_in_jobs_of_their_runtime_images(
    release: Release,
) -> None:
    """The JVM and Node each answer a probe in the image built from images/Dockerfile, as UID
    65532 with a read-only root, no token, no capabilities and the chart's memory limit."""
    started = time.monotonic()
    for language in ("java", "typescript"):
        release.apply(
            bundle(f"orders-{language}", release.git_url(), language, language, language=language)
        )

    def both_ready() -> bool:
        return all(
            condition(release.get("thb", f"orders-{language}"), "Ready").get("status") == "True"
            for language in ("java", "typescript")
        )

    wait_for("orders-java and orders-typescript Ready", both_ready, release, WAIT_SECONDS)
    report(
        "chart on real node: Java and TypeScript bundles applied to Ready "
        f"{time.monotonic() - started:.1f}s"
    )
    assert bindings(release.db_url, "orders-java") == {(DAG, "transform"): "transform.jar"}
    assert bindings(release.db_url, "orders-typescript") == {(DAG, "publish"): "publish.min.mjs"}
    for language in ("java", "typescript"):
        (job,) = probe_jobs(release, f"orders-{language}")
        pods = release.get("pods", "-l", f"job-name={job}")["items"]
        assert pods, f"the probe Job {job} left no pod"
        spec = pods[0]["spec"]
        assert spec["nodeName"] == NODE
        assert spec.get("automountServiceAccountToken") is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        (probe,) = [c for c in spec["containers"] if c["image"].startswith(LOCAL_IMAGES[language])]
        assert probe["imagePullPolicy"] == "Never"
        assert probe["resources"]["limits"]["memory"], probe["resources"]
        for c in spec["containers"] + spec.get("initContainers", []):
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
        status = pods[0]["status"]
        exits = [
            s["state"]["terminated"]["exitCode"]
            for s in status.get("containerStatuses", [])
            if "terminated" in s.get("state", {})
        ]
        assert exits and set(exits) == {0}, status


def test_probe_over_its_memory_limit_is_reported_out_of_memory(release: Release) -> None:
    release.apply(
        bundle(
            "orders-oom",
            release.git_url(),
            "go-load",
            "go-load",
            {"resources": {"limits": {"memory": "12Mi"}}},
        )
    )

    def out_of_memory() -> bool:
        thb = release.get("thb", "orders-oom")
        text = json.dumps(thb.get("status", {}))
        return "OutOfMemory" in text

    wait_for("orders-oom reported OutOfMemory", out_of_memory, release, WAIT_SECONDS)
    assert bindings(release.db_url, "orders-oom") == {}
    # The next test binds the same task from another bundle.
    release.kubectl("delete", "thb", "orders-oom", "--wait=true")


def _operator_host_pid(pod: dict[str, Any]) -> int:
    """The host pid of the operator container's main process (found by its pod's cgroup)."""
    uid = pod["metadata"]["uid"]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            cgroup = (entry / "cgroup").read_text()
        except OSError:
            continue
        main = any(arg.endswith(b"taskhandler-operator") for arg in cmdline[:2])
        if uid in cgroup and main and b"run" in cmdline:
            return int(entry.name)
    raise AssertionError(f"no operator process in the cgroup of pod {uid}")


def test_operator_killed_is_restarted_without_a_duplicate_job(release: Release) -> None:
    release.apply(bundle("orders-load", release.git_url(), "go-load", "go-load"))
    seen: set[str] = set()

    def job_created() -> bool:
        seen.update(probe_jobs(release, "orders-load"))
        return bool(seen)

    wait_for("a probe Job for orders-load", job_created, release, WAIT_SECONDS)
    pod = release.operator_pod()
    os.kill(_operator_host_pid(pod), signal.SIGKILL)

    def restarted_and_ready() -> bool:
        seen.update(probe_jobs(release, "orders-load"))
        status = operator_status(release.operator_pod())
        return bool(status.get("restartCount") == 1 and status.get("ready"))

    wait_for(
        "the operator restarted by the kubelet and Ready",
        restarted_and_ready,
        release,
        WAIT_SECONDS,
    )
    after = release.operator_pod()
    assert after["metadata"]["uid"] == pod["metadata"]["uid"], "the kubelet restarts, not a new pod"

    def ready() -> bool:
        seen.update(probe_jobs(release, "orders-load"))
        return condition(release.get("thb", "orders-load"), "Ready").get("status") == "True"

    wait_for("orders-load Ready", ready, release, WAIT_SECONDS)
    assert len(seen) == 1, f"duplicate probe Jobs: {sorted(seen)}"
    assert bindings(release.db_url, "orders-load") == {(DAG, "load"): "load"}


def test_helm_uninstall_leaves_nothing_behind(release: Release) -> None:
    release.cluster.helm("uninstall", RELEASE, "-n", release.namespace, "--wait", timeout=330)
    wait_for(
        "the operator pod gone",
        lambda: not release.get("pods", "-l", OPERATOR_SELECTOR)["items"],
        release,
        120,
    )
    left = release.kubectl(
        "get",
        "deployment,replicaset,pod,service,configmap,secret,serviceaccount,role,rolebinding,"
        "networkpolicy,job,lease,clusterrole,clusterrolebinding",
        "-l", f"app.kubernetes.io/instance={RELEASE}", "-o", "name",
    ).stdout.split()  # fmt: skip
    # Only the signing key stays, on purpose (helm.sh/resource-policy: keep): signatures made
    # with it must stay verifiable by a reinstalled release.
    kept = "secret/thop-taskhandler-operator-signing-key"
    assert left == [kept], left
    annotations = release.get(kept)["metadata"].get("annotations", {})
    assert annotations.get("helm.sh/resource-policy") == "keep"
    # The leader Lease is the operator's, not the chart's: it stays (docs/install.md, Uninstall).
    leases = [lease["metadata"]["name"] for lease in release.get("lease")["items"]]
    assert leases == ["taskhandler-operator"], leases

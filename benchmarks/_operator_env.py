"""What the operator benchmark drives: PostgreSQL with statement statistics, the real control
plane, the chart's operator command run as a host process, TypeScript bundles on a volume, and
the counters read from the operator's, the apiserver's and PostgreSQL's own statistics.

Pure helpers (parsing metrics text, job timings) are separate from the process handling so the
numbers they produce are easy to check by eye in the JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import psutil
import sqlalchemy as sa
import urllib3
import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from prometheus_client.parser import text_string_to_metric_families

from taskhandler_devenv import manifests
from taskhandler_devenv.chart_install import CHART, HostPorts, process_node_values
from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.kubecluster.procs import free_port
from taskhandler_devenv.operator_process import (
    OperatorReplica,
    poll_until,
    prepare_operator_namespace,
)
from taskhandler_devenv.packers import pack_typescript_bundle
from taskhandler_devenv.runtimes import SOURCES, typescript_code
from taskhandler_operator.kube import names

OPERATOR_USER = "taskhandler-operator-bench"
CLUSTER_ID = "bench"
#: The image the process node runs TypeScript probes from (the host's node).
NODE_IMAGE = "registry.local/taskhandler-operator-node:e2e"
#: Where the chart mounts files into the operator's pod; mapped to host paths here.
POD_DATABASE_URL = "/etc/taskhandler-operator/database/url"
POD_SIGNING_KEY = "/etc/taskhandler-operator/signing-key/key"
POD_REVISIONS = "/var/lib/taskhandler-operator/revisions"
RECONCILES = "taskhandler_operator_reconcile_duration_seconds"
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION", "APPLY"})
_TS_SOURCE = SOURCES / "typescript" / "runtime.mjs"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- the cluster side ---------------------------------------------------------------------------


def make_namespace(cluster: KubeCluster, namespace: str) -> None:
    """A namespace as the chart's probe namespaces (restricted Pod Security, the probe account,
    the operator's namespaced RBAC bound to its own user), ready for pods."""
    cluster.kubectl("create", "namespace", namespace)
    prepare_operator_namespace(cluster, namespace, OPERATOR_USER)
    # Pods are refused until the serviceaccount controller has made the default account.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done = cluster.kubectl("get", "sa", "default", "-n", namespace, check=False)
        if done.returncode == 0:
            break
        time.sleep(0.2)


def admin_api(cluster: KubeCluster) -> k8s_client.ApiClient:
    api: k8s_client.ApiClient = k8s_config.new_client_from_config(
        config_file=str(cluster.kubeconfig)
    )
    return api


def bundle_manifest(
    namespace: str,
    name: str,
    source: Mapping[str, Any],
    *,
    interval: str = "1h",
    parallelism: int = 4,
    **spec: Any,
) -> dict[str, Any]:
    """A TypeScript bundle on its own queue, probed ``parallelism`` Jobs at a time; ``spec``
    adds further fields (e.g. ``publish``)."""
    return manifests.bundle_manifest(
        namespace,
        name,
        language="typescript",
        source=source,
        queues=[name],
        interval=interval,
        probe={"timeout": "2m", "parallelism": parallelism},
        **spec,
    )


def bundle_status(api: k8s_client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    obj = cast(
        "dict[str, Any]",
        k8s_client.CustomObjectsApi(api).get_namespaced_custom_object(
            names.GROUP, names.VERSION, namespace, names.PLURAL, name
        ),
    )
    status: dict[str, Any] = obj.get("status") or {}
    return status


def is_ready(status: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )


def list_bundles(api: k8s_client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    found = cast(
        "dict[str, Any]",
        k8s_client.CustomObjectsApi(api).list_namespaced_custom_object(
            names.GROUP, names.VERSION, namespace, names.PLURAL
        ),
    )
    items: list[dict[str, Any]] = found["items"]
    return items


def apiserver_requests(cluster: KubeCluster) -> dict[tuple[str, str], float]:
    """``(verb, resource[/subresource]) -> count`` from the apiserver's own /metrics."""
    text = cluster.kubectl("get", "--raw", "/metrics", timeout=60).stdout
    counts: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            labels = sample.labels
            resource = labels.get("resource", "")
            if labels.get("subresource"):
                resource += "/" + labels["subresource"]
            key = (labels.get("verb", ""), resource)
            counts[key] = counts.get(key, 0.0) + sample.value
    return counts


def request_delta(
    before: Mapping[tuple[str, str], float], after: Mapping[tuple[str, str], float]
) -> dict[tuple[str, str], float]:
    return {
        key: after[key] - before.get(key, 0.0)
        for key in after
        if after[key] - before.get(key, 0.0) > 0
    }


# --- the apiserver's audit log: requests of one user ---------------------------------------------

#: An audit policy that records one user's requests (metadata only) and nothing else.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
  - level: Metadata
    users: ["{user}"]
  - level: None
"""


def audit_args(folder: Path, user: str = OPERATOR_USER) -> list[str]:
    """kube-apiserver flags writing ``user``'s requests to ``folder/audit.log``: the
    apiserver's own count of what one client asked, watches told apart from the rest."""
    folder.mkdir(parents=True, exist_ok=True)
    policy = folder / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY.format(user=user))
    return [
        f"--audit-policy-file={policy}",
        f"--audit-log-path={folder / 'audit.log'}",
        "--audit-log-format=json",
        "--audit-log-mode=blocking",
        "--audit-log-maxsize=1024",
    ]


@dataclass
class AuditCounter:
    """Counts the audited requests written after :meth:`mark` (one JSON event a line)."""

    path: Path
    offset: int = 0

    def mark(self) -> None:
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def requests(self, namespace: str) -> dict[tuple[str, str], int]:
        """``(verb, resource[/subresource]) -> count`` in ``namespace`` since the mark."""
        counts: dict[tuple[str, str], int] = {}
        if not self.path.exists():
            return counts
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            for raw in handle:
                try:
                    event = json.loads(raw)
                except ValueError:
                    continue  # a line being written
                ref = event.get("objectRef") or {}
                if ref.get("namespace") != namespace or event.get("stage") != "ResponseComplete":
                    continue
                resource = str(ref.get("resource") or "")
                if ref.get("subresource"):
                    resource += "/" + str(ref["subresource"])
                key = (str(event.get("verb") or ""), resource)
                counts[key] = counts.get(key, 0) + 1
        return counts


# --- probe Jobs, watched -------------------------------------------------------------------------


@dataclass
class JobWatcher:
    """Watches the namespace's probe Jobs: when each was first seen and first seen finished
    (monotonic seconds), so a Job's wall time is measured to the watch's latency, not the
    API's one-second timestamps."""

    api: k8s_client.ApiClient
    namespace: str
    created: dict[str, float] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> JobWatcher:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        batch = k8s_client.BatchV1Api(self.api)
        selector = f"{names.LABEL_MANAGED_BY}={names.MANAGER}"
        version = ""
        while not self._stop.is_set():
            stream = k8s_watch.Watch()
            try:
                for event in stream.stream(
                    batch.list_namespaced_job,
                    self.namespace,
                    label_selector=selector,
                    resource_version=version or None,
                    timeout_seconds=3600,
                ):
                    self._seen(event["object"])
                    version = event["object"].metadata.resource_version
                    if self._stop.is_set():
                        stream.stop()
                        break
            except k8s_client.ApiException:
                version = ""
            except (urllib3.exceptions.HTTPError, OSError):
                # The apiserver may end a watch stream mid-chunk; resume from the last event
                # seen, or a Job created meanwhile is never measured.
                time.sleep(0.2)

    def _seen(self, job: Any) -> None:
        uid = job.metadata.uid
        now = time.monotonic()
        self.created.setdefault(uid, now)
        status = job.status
        if status is not None and ((status.succeeded or 0) > 0 or (status.failed or 0) > 0):
            self.finished.setdefault(uid, now)

    def durations(self, since: float = 0.0) -> list[float]:
        return [
            self.finished[uid] - start
            for uid, start in self.created.items()
            if start >= since and uid in self.finished
        ]

    def created_since(self, since: float) -> int:
        return sum(1 for start in self.created.values() if start >= since)

    def stop(self) -> None:
        self._stop.set()


# --- the operator process ------------------------------------------------------------------------


def chart_container(release: str, namespace: str, values: Sequence[str], helm: Path) -> Any:
    """The operator container of the chart's Deployment, rendered with ``helm template``."""
    done = subprocess.run(
        [str(helm), "template", release, str(CHART), "--namespace", namespace, *values],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    for document in yaml.safe_load_all(done.stdout):
        if document and document.get("kind") == "Deployment":
            return document["spec"]["template"]["spec"]["containers"][0]
    raise RuntimeError("the chart rendered no Deployment")


@dataclass
class OperatorProcess(OperatorReplica):
    """``taskhandler-operator run`` as the chart's Deployment runs it, on this host, with what
    the benchmark reads of it: its metrics, CPU time and peak memory."""

    metrics_port: int = 0
    stop_timeout: float = 60

    def metrics(self) -> dict[str, float] | None:
        """Sums of the operator's metric samples by name (None while it does not answer)."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
            ) as response:
                text = response.read().decode()
        except OSError:
            return None
        sums: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
        return sums

    def passes(self) -> float:
        """Reconcile passes finished so far, all bundles and outcomes together."""
        sums = self.metrics() or {}
        return sums.get(f"{RECONCILES}_count", 0.0)

    def cpu_seconds(self) -> float:
        """User + system CPU of the process and its children (git, for instance)."""
        process = psutil.Process(self.pid)
        total = 0.0
        for p in [process, *process.children(recursive=True)]:
            try:
                times = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total

    def peak_rss_mib(self) -> float:
        """The kernel's high-water mark of the process's resident set (VmHWM)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmHWM in /proc status")


def chart_operator(
    cluster: KubeCluster,
    namespace: str,
    database_url: str,
    workdir: Path,
    *,
    parallelism: int,
    name: str = "operator",
) -> OperatorProcess:
    """The chart's operator container (command, args, env) turned into a host process.

    ``helm template`` renders the Deployment with the values the process node needs
    (``devenv.chart_install``); then what the kubelet would supply is supplied here: the
    downward-API namespace, the mounted Secrets as host files (the database URL, a signing key
    shared by every replica of ``workdir``), the revisions volume as a host folder, and the
    operator's identity as a kubeconfig of a user bound to the chart's own RBAC rules instead of
    the pod's service account token.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    ports = HostPorts(artifact_server=free_port(), metrics=free_port(), health=free_port())
    # The benchmarks' volume bundles live in <work>/volumes (a host folder here, a mounted
    # claim in a cluster): the one folder volume sources may read.
    volumes = workdir.parent / "volumes"
    values = process_node_values(
        ports,
        database_secret="bench-database",
        watch_namespaces=(namespace,),
        extra=(
            f"clusterId={CLUSTER_ID}",
            f"probe.parallelism={parallelism}",
            f"probe.runtimeImages.typescript.repository={NODE_IMAGE.rsplit(':', 1)[0]}",
            f"probe.runtimeImages.typescript.tag={NODE_IMAGE.rsplit(':', 1)[1]}",
            f"volumeSources.roots={{{volumes}}}",
        ),
    )
    container = chart_container("bench", namespace, values, cluster.bins["helm"])
    url_file = workdir / "database-url"
    url_file.write_text(database_url)
    url_file.chmod(0o600)
    key_file = workdir / "signing-key"
    if not key_file.exists():
        key_file.write_text(os.urandom(32).hex())
    host_paths = {
        POD_DATABASE_URL: str(url_file),
        POD_SIGNING_KEY: str(key_file),
        POD_REVISIONS: str(workdir / "revisions"),
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("THOP_")}
    for item in container["env"]:
        if "valueFrom" in item:
            if item["valueFrom"].get("fieldRef", {}).get("fieldPath") != "metadata.namespace":
                raise RuntimeError(f"unexpected valueFrom in the chart: {item}")
            env[item["name"]] = namespace
            continue
        env[item["name"]] = host_paths.get(item["value"], item["value"])
    env["KUBECONFIG"] = str(cluster.user_kubeconfig(OPERATOR_USER))
    # The container's command is on the image's PATH; here it is this venv's console script.
    command = [str(Path(sys.executable).parent / container["command"][0])]
    argv = [*command, *container["args"]]
    return OperatorProcess(argv, env, workdir / name, metrics_port=ports.metrics)


# --- PostgreSQL statement statistics ----------------------------------------------------------


def statements_executed(admin_url: str, database: str) -> int:
    """Statements executed in ``database`` so far (pg_stat_statements, top level and nested,
    utility statements such as BEGIN/COMMIT included)."""
    engine = sa.create_engine(admin_url)
    try:
        with engine.connect() as conn:
            total = conn.execute(
                sa.text(
                    "SELECT coalesce(sum(s.calls), 0) FROM pg_stat_statements s "
                    "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = :db"
                ),
                {"db": database},
            ).scalar_one()
    finally:
        engine.dispose()
    return int(total)


# --- bundle content ----------------------------------------------------------------------------


def handler_spec(dag_id: str, task_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    return {dag_id: [{"task_id": t, "binding": "named", "params": []} for t in task_ids]}


def typescript_artifact(
    spec: Mapping[str, Any], mode: str = "ok", options: Mapping[str, Any] | None = None
) -> bytes:
    """A packed TypeScript test runtime declaring ``spec`` (no toolchain needed to build it)."""
    return pack_typescript_bundle(
        typescript_code(dict(spec), mode, options), sources={"runtime.mjs": _TS_SOURCE.read_bytes()}
    )


def write_world_readable(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(0o644)


def wait_until(what: str, check: Callable[[], bool], timeout: float, poll: float = 0.1) -> float:
    """Poll ``check`` until it holds; the monotonic time it first held. Raises on timeout."""
    return poll_until(what, lambda: time.monotonic() if check() else None, timeout, poll)

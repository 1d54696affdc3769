"""``make demo``: the operator installed with its Helm chart on a local control plane.

It builds what is missing (stating the one-time cost first), starts the local control plane
(etcd, kube-apiserver, kube-controller-manager and a node: the real node, a kubelet with
containerd and runc running the images built from ``images/``, where it can start, else the
process node, which runs pods as host processes; ``--node`` chooses, and the output says which
ran and why), a throwaway PostgreSQL with Airflow's schema made by ``airflow db migrate`` and the
example Dag ``orders_etl`` written by ``airflow dags reserialize``, serves the three example
bundles (Go, Java and TypeScript test runtimes) from a git server pod (the manifests of
``hack/kind/examples/``, which the kind path applies too), installs the chart
with the real helm (its hook Job runs ``db upgrade``; the operator runs from the chart's
Deployment), applies three TaskHandlerBundles and waits until they are Ready. Then it prints
``kubectl get thb``, the bindings the scheduler resolves, and how to try things, and keeps
running until Ctrl-C (``--once``: it stops right away). Everything it started is stopped and
removed at the end, on failure and on Ctrl-C too. The example data and the dev servers are
``taskhandler_devenv``; the product does the work, this script orchestrates and prints.

Exit status: 0 ok, 1 when a step failed ("demo FAILED in step ..." with diagnostics), 130 on
Ctrl-C (or SIGTERM, SIGHUP), also when stdout broke meanwhile (``| tee`` stopped by the same
Ctrl-C). If it is killed outright, its servers die by a parent-death signal and its guardian
(``devenv/guardian.py``) stops PostgreSQL and removes the folders; the real node's watchdog
kills its pods and restores the host (its nftables tables, the demo's forwards included).
``--until 2|3`` stops after the control plane (and PostgreSQL). See ``docs/demo.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, Final, Literal

import sqlalchemy as sa

from taskhandler_devenv import console, orders_cluster
from taskhandler_devenv.chart_install import CHART, HostPorts, process_node_values
from taskhandler_devenv.guardian import Guardian
from taskhandler_devenv.images import app_version, build_images
from taskhandler_devenv.kubecluster.bins import (
    BUILD_SCRIPT,
    REPO_ROOT,
    BinaryCacheError,
    check_bins,
    expected_versions,
)
from taskhandler_devenv.kubecluster.control_plane import (
    ControlPlaneOptions,
    KubeCluster,
    start_cluster,
)
from taskhandler_devenv.kubecluster.procs import free_port
from taskhandler_devenv.kubecluster.realnode import check as realnode_check
from taskhandler_devenv.kubecluster.realnode import real_node_unavailable
from taskhandler_devenv.orders_example import (
    BUNDLES,
    DAG_ID,
    STUB_ARGUMENTS,
    register_bundles,
)
from taskhandler_devenv.postgres import (
    AIRFLOW_VERSION,
    VENV_SCRIPT,
    AirflowCli,
    PostgresServer,
    airflow_venv_path,
)
from taskhandler_devenv.realnode_install import (
    ARTIFACT_IP,
    IMAGE_REVISION,
    POSTGRES_IP,
    Exposure,
    Forward,
    pods_may_connect,
    real_node_values,
)
from taskhandler_operator.db.engine import create_sync_engine
from taskhandler_operator.db.tables import ARTIFACT_TABLE, BINDING_TABLE
from taskhandler_operator.kube import names
from taskhandler_operator.scheduler import resolve_task_handlers_sync

NAMESPACE: Final = orders_cluster.NAMESPACE
RELEASE: Final = "thop"
DEPLOYMENT: Final = f"{RELEASE}-taskhandler-operator"
DB_SECRET: Final = "airflow-db"  # noqa: S105 - a Secret's name
READY_TIMEOUT: Final = 300.0
HEARTBEAT: Final = 30.0
BUNDLE_NAMES: Final = tuple(b.name for b in BUNDLES)
LAST_STEP: Final = 8
ONE_TIME_COST: Final = (
    "One-time cost on a fresh machine (cached in $THOP_CACHE afterwards): the Kubernetes "
    "binaries built from source, 10 to 45 min (an idle or a busy machine); the Airflow side "
    "venv, about 30 s; the three test runtimes, about 1 min; for the real node (as root) its "
    "binaries (make node-bins, which make demo runs), about 16 min, and BuildKit, the base "
    "images and the three images, about 30 min; for the process node its venv, about 1 min. "
    "A warm run is ready in about 1 min (1.5 min on the real node)."
)
NodeKind = Literal["process", "real"]
ARTIFACT_PORT: Final = 8090
GIT_PORT: Final = 8080  # the server's own port in its pod (hack/kind/examples/git-server.yaml)


class StepFailed(Exception):
    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"{step}: {message}")
        self.step = step
        self.message = message


def say(line: str = "", indent: int = 0) -> None:
    # Never raises: a shutdown must finish when `| tee` was stopped by the same Ctrl-C.
    console.emit(" " * indent + line)


def say_block(text: str, indent: int = 4) -> None:
    for line in text.rstrip("\n").splitlines():
        say(line.rstrip(), indent if line.strip() else 0)


def run_streamed(label: str, argv: Sequence[str], env: dict[str, str] | None = None) -> str:
    """Run a build script, echoing its output and a line every ``HEARTBEAT`` s of silence;
    returns its last output line."""
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
        env=env,
    )  # fmt: skip
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    last, quiet_since = "", started
    try:
        while True:
            try:
                line = lines.get(timeout=1.0)
            except queue.Empty:
                if time.monotonic() - quiet_since >= HEARTBEAT:
                    say(f"{label}: still working ({time.monotonic() - started:.0f} s)", 4)
                    quiet_since = time.monotonic()
                continue
            if line is None:
                break
            if line.strip():
                last = line
                say(line, 4)
            quiet_since = time.monotonic()
        code = proc.wait()
    except BaseException:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        raise
    if code != 0:
        raise RuntimeError(f"{label} failed (exit {code}): {last}")
    return last


class Demo:
    def __init__(
        self, root: Path, guardian: Guardian | None = None, node: NodeKind = "process"
    ) -> None:
        self.root = root
        # Decided before step 1 (choose_node): which node runs the pods.
        self.node: NodeKind = node
        self.locked = False
        self.images: dict[str, Path] = {}
        self.exposure: Exposure | None = None
        # What must be undone on the host before PostgreSQL stops (pg_hba.conf).
        self.host_changes = contextlib.ExitStack()
        self.hba_changed = False
        self.bundle_url = ""
        # Cleans up what a parent-death signal cannot reach if this process dies uncleanly.
        self.guardian = guardian
        self.timings: list[tuple[str, float, str]] = []
        self.cluster: KubeCluster | None = None
        self.postgres: PostgresServer | None = None
        self.git_port = 0
        self.url = ""
        self.installed = False
        self.airflow_venv = airflow_venv_path()
        self.artifacts: dict[str, bytes] = {}
        self.git_auth: dict[str, str] = {}

    @property
    def kube(self) -> KubeCluster:
        if self.cluster is None:
            raise RuntimeError("the control plane is not running")
        return self.cluster

    @contextlib.contextmanager
    def step(self, title: str) -> Iterator[None]:
        say()
        say(f"=== {title} " + "=" * max(3, 92 - len(title)))
        started = time.monotonic()
        outcome = "ok"
        try:
            yield
        except Exception as exc:
            outcome = "failed"
            raise StepFailed(title, f"{type(exc).__name__}: {exc}") from exc
        except BaseException:
            outcome = "interrupted"
            raise
        finally:
            self.timings.append((title, time.monotonic() - started, outcome))
        say(f"(step {title.split('.')[0]}: {time.monotonic() - started:.1f} s)")

    def kubectl(self, *args: str, input: str | None = None) -> str:
        done = self.kube.kubectl(*args, input=input, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args[:3])} failed: {done.stderr.strip()}")
        return done.stdout

    # -- 1

    def choose_node(self, requested: str, lock_wait: float) -> None:
        """Which node runs, said in one line. The real node's machine-wide lock is taken here and
        held until the shutdown, so no other run's node starts between the check and ours: with
        ``auto`` a node of another run means the process node at once; ``real`` waits for it."""
        if requested == "process":
            self.node = "process"
            say("node: process (--node process)")
            return
        reason = real_node_unavailable()
        lock_only = reason is not None and reason.startswith(realnode_check.LOCK_REASON)
        if reason is None or (requested == "real" and lock_only):
            wait = lock_wait if requested == "real" else 0.0
            if reason is not None:
                say(f"{reason}: waiting up to {wait:g} s for it to end")
            if realnode_check.acquire_host_lock(wait=wait):
                self.locked = True
                reason = real_node_unavailable()  # this process holds the lock now
            else:
                reason = f"{realnode_check.LOCK_REASON} (waited {wait:g} s)"
        if reason is None:
            self.node = "real"
            say("node: real (kubelet, containerd and runc; the images built from images/)")
            return
        self.release_lock()
        if requested == "real":
            raise RuntimeError(f"real node unavailable: {reason}")
        self.node = "process"
        say(f"node: process (fallback: {reason})")

    def release_lock(self) -> None:
        if self.locked:
            self.locked = False
            realnode_check.release_host_lock()

    def build_images(self) -> None:
        """images/Dockerfile's three images for the real node (BuildKit, cached by content)."""
        run_streamed("hack/build-buildkit.sh", ["bash", str(REPO_ROOT / "hack/build-buildkit.sh")])
        started = time.monotonic()
        self.images = build_images(revision=IMAGE_REVISION)
        say(f"images (cached by content; docs/images.md), {time.monotonic() - started:.1f} s:")
        for ref in self.images:
            say(ref, 4)

    def build(self, requested: str = "process", lock_wait: float = 0.0) -> None:
        self.choose_node(requested, lock_wait)
        try:
            bins = check_bins(expected_versions())
            say(f"Kubernetes binaries: cached in {bins.dir}")
        except BinaryCacheError as exc:
            say(f"Kubernetes binaries: building ({exc})")
            run_streamed("hack/build-k8s.sh", ["bash", str(BUILD_SCRIPT)])
        if not (self.airflow_venv / ".thop-complete").is_file():
            say(f"Airflow {AIRFLOW_VERSION} side venv: building in {self.airflow_venv}")
        env = {**os.environ, "AIRFLOW_VERSION": AIRFLOW_VERSION}
        run_streamed("hack/airflow-venv.sh", ["bash", str(VENV_SCRIPT)], env)
        if self.node == "real":
            self.build_images()
        else:
            node_venv = run_streamed(
                "hack/node-venv.sh", ["bash", str(REPO_ROOT / "hack/node-venv.sh")]
            )
            # The process node runs the operator image from it; no second check at cluster start.
            os.environ["THOP_NODE_VENV_BIN"] = node_venv
            say(f"node venv (the operator image on the process node): {node_venv}")
        self.artifacts = orders_cluster.build_artifacts(say)

    # -- 2

    def start_cluster(self) -> None:
        options = ControlPlaneOptions(node=self.node)
        self.cluster = start_cluster(check_bins(expected_versions()), options)
        if self.guardian is not None:
            self.guardian.remove(self.cluster.root)
            for pid in self.cluster.pids:
                self.guardian.process_group(pid)
        say(
            f"etcd, kube-apiserver, kube-controller-manager and the {self.node} node ready in "
            f"{self.cluster.startup_seconds:.1f} s"
        )
        say(f"kubeconfig: {self.cluster.kubeconfig}")
        node = self.cluster.real_node
        if node is not None:
            started = time.monotonic()
            for archive in self.images.values():
                node.import_image(archive)
            say(
                f"{len(self.images)} images imported into the node's containerd in "
                f"{time.monotonic() - started:.1f} s (imagePullPolicy: Never, no registry)"
            )

    # -- 3

    def start_database(self) -> None:
        self.postgres = PostgresServer()
        self.postgres.start()
        if self.guardian is not None:
            self.guardian.postmaster(self.postgres.data_dir)
            self.guardian.remove(self.postgres.workdir)
        self.postgres.create_database("airflow")
        self.url = self.postgres.url("airflow")
        say(f"PostgreSQL on 127.0.0.1:{self.postgres.port}, database airflow")
        orders_cluster.seed_orders_dag(
            AirflowCli(self.airflow_venv), self.url, self.root / "dags", say
        )

    # -- 4

    def serve_bundles(self) -> None:
        """The shared manifests of hack/kind/examples/: the namespace, the git server pod (on
        a free host port: the process node's pods share the host's network), then the push."""
        self.kubectl("apply", "-f", str(orders_cluster.MANIFESTS / "namespace.yaml"))
        self.kubectl(
            "wait", "--for=jsonpath={.metadata.name}=default", "serviceaccount/default",
            "-n", NAMESPACE, "--timeout=60s",
        )  # fmt: skip
        password = secrets.token_hex(12)
        self.git_auth = {"username": orders_cluster.GIT_USER, "password": password}
        secret = orders_cluster.git_secret(password)
        self.kubectl("apply", "-f", "-", input=json.dumps(secret))
        if self.node == "real":
            server = orders_cluster.on_real_node(
                orders_cluster.load("git-server"), self.image_ref("operator")
            )
        else:
            self.git_port = free_port()
            server = orders_cluster.on_process_node(
                orders_cluster.load("git-server"), self.git_port
            )
        self.kubectl("apply", "-f", "-", input=orders_cluster.as_list(server))
        say(f"namespace {NAMESPACE} (Pod Security restricted), Secret git-auth, the git server")
        say("(hack/kind/examples/namespace.yaml and git-server.yaml, as make kind-examples)", 4)
        self.kubectl(
            "rollout", "status", f"deployment/{orders_cluster.SERVER}", "-n", NAMESPACE,
            "--timeout=120s",
        )  # fmt: skip
        if self.node == "real":
            # No cluster DNS and no kube-proxy on this node: the pod's own address, which the
            # host reaches over the node's bridge as the operator pod does.
            address = self.pod_ip(f"app.kubernetes.io/name={orders_cluster.SERVER}")
            url = f"http://{address}:{GIT_PORT}/{orders_cluster.REPOSITORY}.git"
            say(f"the git server pod at {address} (no cluster DNS or kube-proxy on the real node)")
        else:
            url = f"http://127.0.0.1:{self.git_port}/{orders_cluster.REPOSITORY}.git"
        self.bundle_url = url
        files = orders_cluster.bundle_files(self.artifacts)
        commit = orders_cluster.push_bundles(
            url, orders_cluster.GIT_USER, password, files, self.root
        )
        say(f"git repository {url} (basic auth), pushed branch main at {commit[:12]}")
        for rel in sorted(files):
            say(rel, 4)
        # As Airflow's dag processor would with a GitDagBundle per bundle at this commit: the
        # workers' DagBundles exist, so DagBundleInSync is True from the first pass.
        engine = create_sync_engine(self.url)
        try:
            with engine.begin() as conn:
                register_bundles(conn, commit, datetime.now(UTC))
        finally:
            engine.dispose()
        say(f"Airflow's dag_bundle rows at version {commit[:12]}: " + ", ".join(BUNDLE_NAMES))

    def image_ref(self, target: str) -> str:
        return next(ref for ref in self.images if f"/taskhandler-{target}:" in ref)

    def pod_ip(self, selector: str) -> str:
        pods = json.loads(
            self.kubectl("get", "pods", "-n", NAMESPACE, "-l", selector, "-o", "json")
        )
        running = [
            p for p in pods["items"]
            if not p["metadata"].get("deletionTimestamp") and p["status"].get("podIP")
        ]  # fmt: skip
        if len(running) != 1:
            raise RuntimeError(f"{len(running)} running pods match {selector}, not 1")
        return str(running[0]["status"]["podIP"])

    # -- 5

    def expose_database(self) -> str:
        """PostgreSQL (loopback only) for the real node's pods: a fixed virtual address DNATed
        to it, and pg_hba.conf letting the pod subnet in; both undone at the shutdown."""
        assert self.postgres is not None
        self.exposure = Exposure()
        self.host_changes.enter_context(pods_may_connect(self.postgres))
        self.hba_changed = True
        self.exposure.add(Forward(POSTGRES_IP, 5432, "127.0.0.1", self.postgres.port))
        say(
            f"PostgreSQL for the pods at {POSTGRES_IP}:5432 (nftables DNAT to 127.0.0.1:"
            f"{self.postgres.port}; pg_hba.conf lets the pod subnet in until the shutdown)"
        )
        host = f"@{self.postgres.host}:{self.postgres.port}/"
        return self.url.replace(host, f"@{POSTGRES_IP}:5432/")

    def install_chart(self) -> None:
        pod_url = self.expose_database() if self.node == "real" else self.url
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": DB_SECRET, "namespace": NAMESPACE},
            "stringData": {"url": pod_url},
        }
        self.kubectl("apply", "-f", "-", input=json.dumps(secret))
        say(f"Secret airflow-db in {NAMESPACE}")
        if self.node == "real":
            values = real_node_values(
                app_version(),
                database_secret=DB_SECRET,
                artifact_url=f"http://{ARTIFACT_IP}:{ARTIFACT_PORT}",
            )
        else:
            ports = HostPorts(free_port(), free_port(), free_port())
            values = process_node_values(ports, database_secret=DB_SECRET)
        argv = ["install", RELEASE, str(CHART), "-n", NAMESPACE, *values, "--wait", "--timeout=5m"]
        say(f"$ helm install {RELEASE} charts/taskhandler-operator -n {NAMESPACE} --wait …")
        started = time.monotonic()
        done = self.kube.helm(*argv, check=False, timeout=330)
        self.installed = True  # even a failed install leaves a release to uninstall
        if done.returncode != 0:
            raise RuntimeError(f"helm install failed: {done.stderr.strip()}")
        say(f"installed in {time.monotonic() - started:.1f} s")
        if self.node == "real" and self.exposure is not None:
            # The probe pods download artifacts from the operator pod: no Service proxy here.
            address = self.pod_ip("app.kubernetes.io/component=operator")
            self.exposure.add(Forward(ARTIFACT_IP, ARTIFACT_PORT, address, ARTIFACT_PORT))
            say(
                f"the operator's artifact server for the probe pods at {ARTIFACT_IP}:"
                f"{ARTIFACT_PORT} (nftables DNAT to the operator pod, {address})"
            )
        engine = create_sync_engine(self.url)
        try:
            with engine.connect() as conn:
                tables = set(sa.inspect(conn).get_table_names())
        finally:
            engine.dispose()
        if not {ARTIFACT_TABLE, BINDING_TABLE} <= tables:
            raise RuntimeError("the pre-install hook Job did not create the binding tables")
        say(
            "the pre-install hook Job ran `taskhandler-operator db upgrade`: "
            f"{BINDING_TABLE} and {ARTIFACT_TABLE} exist next to Airflow's tables"
        )
        say_block(self.kubectl("get", "deploy,jobs,pods", "-n", NAMESPACE))

    # -- 6

    def apply_bundles(self) -> None:
        """hack/kind/examples/bundles.yaml, fetching from the git server's loopback port (the
        process node) or its pod's address (the real node)."""
        if self.node == "real":
            bundles = orders_cluster.on_real_node(
                orders_cluster.load("bundles"), self.image_ref("operator"), self.bundle_url
            )
        else:
            bundles = orders_cluster.on_process_node(orders_cluster.load("bundles"), self.git_port)
        say_block(self.kubectl("apply", "-f", "-", input=orders_cluster.as_list(bundles)), 0)

    def wait_ready(self) -> None:
        say("Conditions as they change (seconds since applied):")
        started = time.monotonic()
        seen: dict[str, str] = {}
        quiet_since = started
        while True:
            items = json.loads(self.kubectl("get", "thb", "-n", NAMESPACE, "-o", "json"))["items"]
            ready = 0
            for item in items:
                conditions = (item.get("status") or {}).get("conditions") or []
                state = ", ".join(
                    f"{c['type']}={c['status']} ({c.get('reason', '')})" for c in conditions
                )
                name = item["metadata"]["name"]
                if state and seen.get(name) != state:
                    seen[name] = state
                    quiet_since = time.monotonic()
                    say(f"{time.monotonic() - started:5.1f} s  {name}: {state}", 2)
                ready += any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
            if ready == len(BUNDLES):
                say(f"all {ready} bundles Ready in {time.monotonic() - started:.1f} s")
                return
            if time.monotonic() - quiet_since >= 15:
                quiet_since = time.monotonic()
                say(f"{quiet_since - started:5.1f} s  {ready} of {len(BUNDLES)} Ready", 2)
            if time.monotonic() - started > READY_TIMEOUT:
                raise RuntimeError(
                    f"{ready} of {len(BUNDLES)} bundles Ready after {READY_TIMEOUT:.0f} s"
                )
            time.sleep(1.0)

    # -- 7

    def show_results(self) -> None:
        say("$ kubectl get thb -n " + NAMESPACE)
        say_block(self.kubectl("get", "thb", "-n", NAMESPACE))
        say(f"$ kubectl get thb -n {NAMESPACE} -o wide")
        say_block(self.kubectl("get", "thb", "-n", NAMESPACE, "-o", "wide"))
        say(f"$ kubectl describe thb orders-go -n {NAMESPACE}")
        say_block(self.kubectl("describe", "thb", "orders-go", "-n", NAMESPACE))
        say("Bindings the scheduler resolves (scheduler.resolve_task_handlers_sync):")
        keys = [(DAG_ID, task_id) for task_id in STUB_ARGUMENTS]
        engine = create_sync_engine(self.url)
        try:
            with engine.connect() as conn:
                refs = resolve_task_handlers_sync(conn, keys)
        finally:
            engine.dispose()
        for key in keys:
            ref = refs.get(key)
            target = "no binding"
            if ref is not None and ref.bundle_info is not None:
                target = f"{ref.bundle_info.name}/{ref.rel_path}"
            say(f"{key[0]}.{key[1]:<10} -> {target}", 4)
        if len(refs) != len(keys):
            raise RuntimeError(f"{len(keys) - len(refs)} stub task(s) resolve to no artifact")

    # -- 8

    def show_try_it(self, once: bool) -> None:
        kube = self.kube
        assert self.postgres is not None
        say("In another terminal (kubectl and helm are the demo's own builds):")
        for line in (
            f"export KUBECONFIG={kube.kubeconfig}",
            f"export PATH={kube.bin_dir}:$PATH",
            "kubectl get thb -A",
            f"kubectl describe thb orders-go -n {NAMESPACE}",
            f"kubectl annotate thb orders-go -n {NAMESPACE} --overwrite "
            f'{names.ANNOTATION_RECONCILE_REQUESTED_AT}="$(date -u +%FT%TZ)"   # reconcile now',
            f"kubectl logs deploy/{DEPLOYMENT} -n {NAMESPACE} --tail=20",
            f"helm list -n {NAMESPACE}",
            f"psql -h 127.0.0.1 -p {self.postgres.port} -U postgres airflow "  # noqa: S608
            "-c 'select * from lang_sdk_task_handler'",
        ):
            say(line, 4)
        if once:
            say("--once: shutting down now")
        else:
            say("The demo keeps running until Ctrl-C; then it removes everything it started.")

    # -- diagnostics and shutdown

    def diagnostics(self) -> None:
        if self.cluster is None:
            return
        say("Diagnostics:")
        kube = self.cluster
        status = kube.kubectl("get", "thb", "-n", NAMESPACE, "-o", "json", check=False)
        with contextlib.suppress(ValueError):
            for item in json.loads(status.stdout).get("items", []):
                say(f"bundle {item['metadata']['name']}:", 2)
                for c in (item.get("status") or {}).get("conditions") or []:
                    message = c.get("message", "")
                    say(f"{c['type']}={c['status']} ({c.get('reason', '')}): {message}", 4)
        say_block(kube.kubectl("get", "pods,jobs", "-n", NAMESPACE, check=False).stdout, 2)
        pods = kube.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json", check=False)
        with contextlib.suppress(ValueError):
            for pod in json.loads(pods.stdout).get("items", []):
                for container in (pod.get("status") or {}).get("containerStatuses") or []:
                    for state in (container.get("state") or {}).values():
                        if state.get("message") or state.get("reason"):
                            why = f"{state.get('reason', '')}: {state.get('message', '')}"
                            say(f"pod {pod['metadata']['name']}: {why}", 2)
        logs = kube.kubectl(
            "logs", f"deploy/{DEPLOYMENT}", "-n", NAMESPACE, "--tail=40", check=False
        )
        say("operator log tail:", 2)
        say_block(logs.stdout + logs.stderr, 4)

    def close(self) -> list[str]:
        """Stop and remove everything this run started; what did not go as it should."""
        problems: list[str] = []

        def attempt(what: str, action: Any) -> None:
            try:
                action()
                say(f"{what}: done")
            except Exception as exc:
                problems.append(f"{what}: {exc}")
                say(f"{what}: FAILED ({exc})")

        if self.cluster is not None and self.installed:
            cluster = self.cluster
            attempt(
                f"helm uninstall {RELEASE}",
                lambda: cluster.helm(
                    "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout=1m"
                ),
            )
        if self.exposure is not None:
            attempt("remove the nftables forwards to the host's servers", self.exposure.close)
            self.exposure = None
        if self.hba_changed:
            self.hba_changed = False
            attempt("put PostgreSQL's pg_hba.conf back", self.host_changes.close)
        if self.cluster is not None:
            cluster, self.cluster = self.cluster, None
            attempt(f"stop the control plane and the {self.node} node", cluster.stop)
        self.release_lock()
        if self.postgres is not None:
            postgres, self.postgres = self.postgres, None
            attempt("stop PostgreSQL", postgres.stop)
        shutil.rmtree(self.root, ignore_errors=True)
        say(f"$DEMO removed: {'no' if self.root.exists() else 'yes'}")
        return problems


def hold(once: bool) -> None:
    """Keep everything running until Ctrl-C (``--once``: return at once)."""
    if not once:
        while True:
            time.sleep(3600)


def run_demo(
    demo: Demo, once: bool, until: int = LAST_STEP, node: str = "auto", lock_wait: float = 0.0
) -> None:
    with demo.step("1. Build what is missing (one-time, then cached)"):
        demo.build(node, lock_wait)
    with demo.step(f"2. Start the local control plane with the {demo.node} node"):
        demo.start_cluster()
    if until == 2:
        hold(once)
        return
    with demo.step(f"3. PostgreSQL with Airflow's schema and the Dag {DAG_ID}"):
        demo.start_database()
    if until == 3:
        say(f"--until 3: the control plane and PostgreSQL run until {'now' if once else 'Ctrl-C'}")
        hold(once)
        return
    with demo.step("4. Serve the three example bundles from a git server in the cluster"):
        demo.serve_bundles()
    with demo.step("5. Install the chart with helm (the hook Job runs db upgrade)"):
        demo.install_chart()
    with demo.step("6. Apply three TaskHandlerBundles and wait until they are Ready"):
        demo.apply_bundles()
        demo.wait_ready()
    with demo.step("7. kubectl get thb and the bindings the scheduler resolves"):
        demo.show_results()
    with demo.step("8. Try it"):
        demo.show_try_it(once)
    hold(once)


STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def interrupt(signum: int, _frame: FrameType | None) -> None:
    # The first signal stops the demo; later ones must not cut its shutdown short (the tools
    # the shutdown runs inherit the ignoring).
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--once", action="store_true", help="exit after printing (for tests)")
    parser.add_argument(
        "--until",
        type=int,
        choices=(2, 3, LAST_STEP),
        default=LAST_STEP,
        help="stop after this step: 2 the control plane, 3 also PostgreSQL (for the shutdown "
        "tests); then wait for Ctrl-C as after the last step",
    )
    parser.add_argument(
        "--node",
        choices=("auto", "real", "process"),
        default="auto",
        help="auto (the default): the real node where it can start, else the process node, "
        "saying why; real: fail when it cannot start (waiting up to THOP_REAL_NODE_LOCK_WAIT s, "
        "default 900, for another run's real node); process: the process node",
    )
    args = parser.parse_args(argv)
    lock_wait = float(os.environ.get("THOP_REAL_NODE_LOCK_WAIT", "900"))
    # Explicitly: a shell starting the demo in the background leaves SIGINT ignored.
    for sig in STOP_SIGNALS:
        signal.signal(sig, interrupt)
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="thop-demo-"))
    guardian = Guardian()
    guardian.remove(root)
    say("taskhandler-operator demo: the Helm chart on a local control plane, three bundles")
    say(f"work folder $DEMO = {root}")
    say(ONE_TIME_COST)
    demo = Demo(root, guardian)
    failure: StepFailed | None = None
    interrupted = ""
    try:
        run_demo(demo, args.once, args.until, args.node, lock_wait)
    except StepFailed as exc:
        failure = exc
        say()
        say(f"demo FAILED in step {exc.step}")
        say(exc.message, 2)
        try:
            demo.diagnostics()
        except (Exception, KeyboardInterrupt):  # a Ctrl-C here still shuts down
            say("(diagnostics cut short)")
    except KeyboardInterrupt as exc:
        interrupted = str(exc) or "SIGINT"
    # Shutting down: no signal may cut it short (nor a second one the handler did not see).
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    say()
    say("=== 9. Shut down " + "=" * 79)
    problems = demo.close()
    if problems:
        guardian.abandon()  # it removes what the shutdown could not
    else:
        guardian.release()
    say(f"total {time.monotonic() - started:.0f} s")
    if failure is not None:
        say(f"demo FAILED in step {failure.step}")
        return 1
    if interrupted:
        step = next((f"in step {t}" for t, _s, o in demo.timings if o == "interrupted"), None)
        say(f"demo stopped by {interrupted} ({step or f'after step {args.until}'})")
        return 130
    if problems:
        say(f"demo FAILED in step 9. Shut down: {'; '.join(problems)}")
        return 1
    if args.until != LAST_STEP:
        say(f"demo OK up to step {args.until}")
        return 0
    say("demo OK: 3 bundles Ready, 3 stub tasks bound across Go, Java and TypeScript")
    return 0


if __name__ == "__main__":
    code = main()
    console.finish()  # a stdout broken since the last line must not turn 130 into 120
    sys.exit(code)

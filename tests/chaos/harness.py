"""What the chaos tests share: the replayable seed, a recorder of every probe Job the apiserver
ever announced (a real watch, resumed across apiserver/etcd restarts), a Go bundle of many
artifacts, and the failure report (bundle status, Jobs and pods, operator log tails, the seed).

The fixtures built on these are in ``tests/chaos/conftest.py``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_operator.kube import names
from tests.e2e.faults_support import Replica, condition, thb, wait_for
from tests.e2e.operator_env import git_bundle, handler_spec
from tests.fixtures.runtimes_plugin import RuntimeFactory
from tests.fixtures.sources import GitRepo

log = logging.getLogger(__name__)
T = TypeVar("T")

SEED_ENV = "THOP_CHAOS_SEED"
#: Seconds a bundle may take to become Ready after a fault (includes a 15 s Lease expiry).
READY_SECONDS = 300.0


@functools.cache
def chaos_seed() -> int:
    """The session's seed: ``THOP_CHAOS_SEED`` when set (to replay a failure), else random."""
    given = os.environ.get(SEED_ENV, "").strip()
    if given:
        return int(given)
    return random.SystemRandom().randrange(1, 2**31)


def seeded(test_id: str) -> random.Random:
    """A generator for one test: the same seed and test id give the same draws."""
    return random.Random(f"{chaos_seed()}:{test_id}")  # fault timing, not secrets


def replay_hint() -> str:
    return f"replay with {SEED_ENV}={chaos_seed()}"


# --- every Job the apiserver announced -----------------------------------------------------------


@dataclass(frozen=True)
class JobSeen:
    uid: str
    name: str
    bundle: str
    artifact: str
    how: str  # "ADDED" from the watch, or "listed" by a (re)list
    at: float  # monotonic time it was recorded


@dataclass
class JobRecorder:
    """Watches the operator's probe Jobs of one namespace from before the first is created until
    ``stop``, recording every ADDED event (one entry per Job uid). The watch resumes from the
    last resourceVersion after a dropped connection (apiserver or etcd restarted); when that
    version is gone (410) it lists again and records what it had not seen."""

    kubeconfig: Path
    namespace: str
    seen: dict[str, JobSeen] = field(default_factory=dict)
    added_events: int = 0
    deleted: list[str] = field(default_factory=list)
    reconnects: int = 0
    relists: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ready: threading.Event = field(default_factory=threading.Event)

    def start(self) -> JobRecorder:
        self._thread = threading.Thread(
            target=self._run, name=f"job-recorder-{self.namespace}", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError(f"the Job watch of {self.namespace} did not start within 60s")
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    # --- what was seen --------------------------------------------------------------------------
    def jobs(self) -> list[JobSeen]:
        with self._lock:
            return list(self.seen.values())

    def by_artifact(self) -> dict[tuple[str, str], list[JobSeen]]:
        """``(bundle, artifact path) -> every Job created for it``."""
        found: dict[tuple[str, str], list[JobSeen]] = {}
        for job in self.jobs():
            found.setdefault((job.bundle, job.artifact), []).append(job)
        return found

    def artifacts_started(self, bundle: str) -> int:
        return sum(1 for b, _ in self.by_artifact() if b == bundle)

    def duplicates(self) -> dict[tuple[str, str], list[JobSeen]]:
        return {key: jobs for key, jobs in self.by_artifact().items() if len(jobs) > 1}

    def summary(self) -> str:
        lines = [
            f"Job watch of {self.namespace}: {len(self.seen)} Jobs, {self.added_events} ADDED "
            f"events, {self.reconnects} reconnects, {self.relists} relists, "
            f"deleted {self.deleted}"
        ]
        lines += [
            f"  {j.bundle}/{j.artifact}: {j.name} uid={j.uid} ({j.how})"
            for j in sorted(self.jobs(), key=lambda j: j.at)
        ]
        return "\n".join(lines)

    # --- the watch -------------------------------------------------------------------------------
    def _record(self, obj: dict[str, Any], how: str) -> None:
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid"))
        with self._lock:
            if uid in self.seen:
                return
            self.seen[uid] = JobSeen(
                uid=uid,
                name=str(meta.get("name")),
                bundle=str((meta.get("labels") or {}).get(names.LABEL_BUNDLE)),
                artifact=str((meta.get("annotations") or {}).get(names.ANNOTATION_ARTIFACT_PATH)),
                how=how,
                at=time.monotonic(),
            )

    def _list(self, batch: k8s_client.BatchV1Api, selector: str) -> str:
        # The raw answer (dicts, like the watch's raw objects); typed as the model it is not.
        response: Any = batch.list_namespaced_job(
            self.namespace, label_selector=selector, _preload_content=False, _request_timeout=30
        )
        listed = json.loads(response.data)
        for item in listed.get("items") or []:
            self._record(item, "listed")
        return str(listed["metadata"]["resourceVersion"])

    def _run(self) -> None:
        api = k8s_config.new_client_from_config(config_file=str(self.kubeconfig))
        batch = k8s_client.BatchV1Api(api)
        selector = f"{names.LABEL_MANAGED_BY}={names.MANAGER}"
        version = ""
        try:
            while not self._stop.is_set():
                try:
                    if not version:
                        version = self._list(batch, selector)
                        self._ready.set()
                    version = self._watch(batch, selector, version)
                except Exception as exc:  # a dropped connection or an error answer: resume
                    if self._stop.is_set():
                        break
                    if isinstance(exc, k8s_client.ApiException) and exc.status == 410:
                        # Our version is older than the (restarted) apiserver's watch cache.
                        self.relists += 1
                        version = ""
                        continue
                    self.reconnects += 1
                    log.info("Job watch of %s: %s; resuming", self.namespace, exc)
                    self._stop.wait(0.5)
        finally:
            api.close()

    def _watch(self, batch: k8s_client.BatchV1Api, selector: str, version: str) -> str:
        """One watch request (bounded); returns the version to resume from ("" to relist)."""
        stream = k8s_watch.Watch().stream(
            batch.list_namespaced_job,
            self.namespace,
            label_selector=selector,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=10,
            _request_timeout=30,
        )
        for event in stream:
            raw = event.get("raw_object") or {}
            kind = event.get("type")
            if kind == "ERROR":
                if raw.get("code") == 410:  # our version was compacted away: list again
                    self.relists += 1
                    return ""
                raise RuntimeError(f"watch error: {raw}")
            version = str((raw.get("metadata") or {}).get("resourceVersion") or version)
            if kind == "ADDED":
                self.added_events += 1
                self._record(raw, "ADDED")
            elif kind == "DELETED":
                self.deleted.append(str(raw["metadata"]["name"]))
            if self._stop.is_set():
                break
        return version


# --- a bundle of many Go artifacts ---------------------------------------------------------------

DAG = "chaos_etl"


def task_of(index: int) -> str:
    return f"step_{index:02d}"


def artifact_of(index: int) -> str:
    return f"step-{index:02d}"


def many_artifacts_repo(repo: GitRepo, runtimes: RuntimeFactory, count: int) -> GitRepo:
    """``count`` Go artifacts under ``go/``, artifact ``step-NN`` serving task ``step_NN``."""
    files: dict[str, bytes | str | None] = {}
    for index in range(count):
        spec = handler_spec((DAG, task_of(index)))
        files[f"go/{artifact_of(index)}"] = Path(runtimes("go", spec=spec)).read_bytes()
    repo.commit(files, f"{count} Go artifacts")
    for index in range(count):  # git keeps the executable mode only when the work tree has it
        (repo.work / "go" / artifact_of(index)).chmod(0o755)
    repo.commit({}, "executable")
    return repo


def stubs(count: int) -> dict[str, list[tuple[str, str]]]:
    """The Dag's ``@task.stub`` tasks, one per artifact, on queue ``go``."""
    return {DAG: [(task_of(index), "go") for index in range(count)]}


def go_bundle(namespace: str, name: str, url: str, parallelism: int) -> dict[str, Any]:
    return git_bundle(
        namespace,
        name,
        language="go",
        url=url,
        path="go",
        probe={"timeout": "1m", "parallelism": parallelism},
    )


# --- waiting and reporting -----------------------------------------------------------------------


def diagnose(
    cluster: KubeCluster,
    namespace: str,
    bundles: Sequence[str],
    replicas: Sequence[Replica] = (),
    recorder: JobRecorder | None = None,
) -> str:
    """Everything a failure needs: each bundle's status, the Jobs and pods, the operator logs'
    tails, the Job watch's record and the seed."""
    parts = []
    for name in bundles:
        got = cluster.kubectl("get", "thb", name, "-n", namespace, "-o", "json", check=False)
        try:
            status = json.dumps(json.loads(got.stdout).get("status"), indent=1)
        except ValueError:
            status = got.stdout + got.stderr
        parts.append(f"--- status of {namespace}/{name}:\n{status[-3000:]}")
    listing = cluster.kubectl("get", "jobs,pods", "-n", namespace, "-o", "wide", check=False)
    parts.append(f"--- jobs and pods:\n{listing.stdout}{listing.stderr}")
    if recorder is not None:
        parts.append(recorder.summary())
    for r in replicas:
        parts.append(f"--- operator log {r.log.name} (starts: {r.starts}):\n{r.tail(40)}")
    parts.append(replay_hint())
    return "\n".join(parts)


def wait_condition(
    cluster: KubeCluster,
    namespace: str,
    name: str,
    type_: str,
    accept: Callable[[dict[str, Any]], bool],
    more: Callable[[], str],
    timeout: float = READY_SECONDS,
) -> dict[str, Any]:
    """Poll the bundle until its condition ``type_`` satisfies ``accept``; the bundle."""

    def check() -> dict[str, Any] | None:
        obj = thb(cluster, namespace, name)
        return obj if accept(condition(obj, type_)) else None

    return wait_for(f"{namespace}/{name} {type_}", check, timeout, more=more)


def wait_ready(
    cluster: KubeCluster, namespace: str, name: str, more: Callable[[], str]
) -> dict[str, Any]:
    return wait_condition(
        cluster, namespace, name, "Ready", lambda c: c.get("status") == "True", more
    )


def readyz(r: Replica) -> int:
    """The replica's /readyz status: 200 while it leads, 503 as a standby, 0 when unreachable."""
    port = r.env["THOP_HEALTH_PORT"]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def wait_leading(r: Replica, more: Callable[[], str], timeout: float = 120.0) -> None:
    wait_for(f"{r.log.name} leads", lambda: readyz(r) == 200, timeout, more=more)

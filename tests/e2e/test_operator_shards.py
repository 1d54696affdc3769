"""Shards on the real parts (control plane + process node, PostgreSQL, a Go runtime in probe
Jobs): the default shard and shard ``b`` (a leader and a standby), each with its own Lease and
artifact server; every bundle reconciled by its own shard only; a bundle relabelled from the
default shard to ``b`` while its probe Job runs is handed over with the Job adopted (never made
twice), its binding rows present throughout and the default shard's other bundle not woken
by the relabel; the resync (every 2 s here) releases nothing still listed; ``b``'s leader
SIGKILLed, its standby takes the ``b`` Lease and goes on while the default shard is left
alone; a bundle of ``b`` serving the default shard's bundle's queue stalls on the claim as it
would in one shard (docs/operator.md, "Shards").

Passes are counted per bundle from each process's ``/metrics``
(``taskhandler_operator_reconcile_duration_seconds_count``); the bundles pass every 5 s.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_operator.kube import names
from tests.chaos.faulty_server import FaultyServer
from tests.chaos.input_faults import Watch, archive, faulty_server, http_bundle, replicas
from tests.e2e.faults_support import Replica, condition, replica, thb, wait_for
from tests.e2e.operator_env import OPERATOR_USER, bindings, handler_spec, seed_dags
from tests.e2e.test_operator import database as database
from tests.fixtures.runtimes_plugin import RuntimeFactory

pytestmark = [
    pytest.mark.kube,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("thb_crd"),
]

__all__ = ["faulty_server", "replicas"]  # fixtures

SELECTOR = f"{names.LABEL_MANAGED_BY}={names.MANAGER}"
PASSES = "taskhandler_operator_reconcile_duration_seconds_count"
INTERVAL = "5s"
TASK = "extract"
#: bundle -> its Dag (its stub on the queue of the bundle's own name).
DAGS = {"stay-default": "shard_a_dag", "stay-b": "shard_b_dag", "mover": "moved_dag"}
READY_SECONDS = 240.0


def passes(r: Replica) -> dict[str, float]:
    """Passes per bundle name (all outcomes) from the replica's /metrics; {} while it is down."""
    port = r.env["THOP_METRICS_PORT"]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == PASSES:
                name = sample.labels["name"]
                out[name] = out.get(name, 0.0) + sample.value
    return out


def fast_poll(what: str, check: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Poll ``check`` every 50 ms (wait_for's 1 s is too coarse to time a relabel)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)
    return True


def leader_gauge(r: Replica) -> dict[str, float]:
    port = r.env["THOP_METRICS_PORT"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        s.labels["shard"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "taskhandler_operator_leader"
    }


def lease(cluster: KubeCluster, ns: str, name: str) -> dict[str, Any]:
    out = cluster.kubectl("get", "lease", name, "-n", ns, "-o", "json", check=False)
    return dict(json.loads(out.stdout)["spec"]) if out.returncode == 0 else {}


def ready(cluster: KubeCluster, ns: str, name: str, revision: str, *logs: Replica) -> None:
    def check() -> bool:
        obj = thb(cluster, ns, name)
        status = obj.get("status") or {}
        return (
            condition(obj, "Ready").get("status") == "True"
            and status.get("revision") == revision
            and status.get("observedGeneration") == obj["metadata"]["generation"]
        )

    def more() -> str:
        status = json.dumps(thb(cluster, ns, name).get("status"), indent=1)[-2500:]
        jobs = cluster.kubectl("get", "jobs,pods", "-n", ns, "-o", "wide", check=False).stdout
        return f"status: {status}\n{jobs}\n" + "\n----\n".join(r.tail(40) for r in logs)

    wait_for(f"{name} Ready at {revision[:12]}", check, READY_SECONDS, more=more)


def probing(cluster: KubeCluster, ns: str, bundle: str) -> str | None:
    """The name of ``bundle``'s probe Job whose probe container is running, if any."""
    out = cluster.kubectl(
        "get", "pods", "-n", ns, "-l", f"{SELECTOR},{names.LABEL_BUNDLE}={bundle}", "-o", "json"
    )
    for pod in json.loads(out.stdout)["items"]:
        for status in (pod.get("status") or {}).get("containerStatuses") or ():
            if status.get("name") == "probe" and "running" in (status.get("state") or {}):
                return str(pod["metadata"]["labels"]["job-name"])
    return None


class BindingPoll:
    """Reads the bundle's binding rows every 0.2 s on a thread; ``empty`` counts the reads that
    found none."""

    def __init__(self, database: str, bundle_name: str) -> None:
        self.database, self.bundle_name = database, bundle_name
        self.reads = self.empty = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            found = bindings(self.database, self.bundle_name)
            self.reads += 1
            if not found:
                self.empty += 1
            self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def test_two_shards_a_relabel_mid_probe_and_a_killed_shard_leader(
    kube_cluster: KubeCluster,
    namespace: str,
    database: str,
    faulty_server: FaultyServer,
    runtime_factory: RuntimeFactory,
    replicas: list[Replica],
    tmp_path: Path,
) -> None:
    ns, cluster = namespace, kube_cluster
    seed_dags(database, {dag: [(TASK, bundle)] for bundle, dag in DAGS.items()})

    def artifact(bundle: str, mode: str = "ok") -> tuple[str, str]:
        spec = handler_spec((DAGS[bundle], TASK))
        data = Path(runtime_factory("go", mode, spec=spec)).read_bytes()
        return faulty_server.put(f"{bundle}-{mode}.tar.gz", archive({TASK: data}))

    def manifest(bundle: str, url: str, sha: str, shard: str | None) -> dict[str, Any]:
        obj = http_bundle(ns, bundle, url, sha)
        obj["spec"] |= {"queues": [bundle], "interval": INTERVAL}
        if shard:
            obj["metadata"]["labels"] = {names.LABEL_SHARD: shard}
        return obj

    def start(name: str, workdir: Path, **extra: str) -> Replica:
        workdir.mkdir(parents=True, exist_ok=True)
        r = replica(cluster, OPERATOR_USER, ns, database, workdir, name, **extra)
        replicas.append(r)
        return r.start()

    jobs = Watch(cluster, ns, "jobs", SELECTOR)
    # Replicas of one shard share a workdir: its revision store and signing key, as the pods
    # of one Deployment share the chart's PVC and Secret. Each process has its own ports.
    # The resync every 2 s (300 s by default): it must never release a bundle still listed.
    resync = {"THOP_SHARD_RESYNC_SECONDS": "2"}
    default = start("default", tmp_path / "default", **resync)
    b_one = start("b1", tmp_path / "b", THOP_SHARD="b", **resync)
    b_two = start("b2", tmp_path / "b", THOP_SHARD="b", **resync)
    everyone = (default, b_one, b_two)

    def more() -> str:
        return "\n----\n".join(r.tail(40) for r in everyone)

    try:
        leases = wait_for(
            "both Leases held",
            lambda: (
                (a, b)
                if (a := lease(cluster, ns, "taskhandler-operator").get("holderIdentity"))
                and (b := lease(cluster, ns, "taskhandler-operator-b").get("holderIdentity"))
                else None
            ),
            120,
            more=more,
        )
        assert leases[0] != leases[1]
        wait_for(
            "one leader of shard b",
            lambda: sorted(leader_gauge(r)["b"] for r in (b_one, b_two)) == [0.0, 1.0],
            60,
            more=more,
        )
        b_leader, b_standby = sorted((b_one, b_two), key=lambda r: -leader_gauge(r)["b"])
        assert leader_gauge(default) == {"default": 1.0}
        # Each shard's artifact server is its own (the URL probe pods download from).
        urls = {r.env["THOP_ARTIFACT_SERVER_URL"] for r in everyone}
        assert len(urls) == 3

        stay_default, stay_b, mover_fast = (
            artifact("stay-default"),
            artifact("stay-b"),
            artifact("mover"),
        )
        for obj in (
            manifest("stay-default", *stay_default, None),
            manifest("stay-b", *stay_b, "b"),
            manifest("mover", *mover_fast, None),
        ):
            cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))
        ready(cluster, ns, "stay-default", stay_default[1], default)
        ready(cluster, ns, "stay-b", stay_b[1], b_leader)
        ready(cluster, ns, "mover", mover_fast[1], default)
        assert set(bindings(database, "mover")) == {(DAGS["mover"], TASK)}
        # The rival, in shard b, serves the default shard's bundle's queue: claims are in the
        # database, so it gets the conflict it would get in the same shard. Applied once
        # stay-default holds the claim: together, either could have claimed it first.
        rival = manifest("rival", *stay_default, "b")
        rival["spec"]["queues"] = ["stay-default"]
        cluster.kubectl("apply", "-f", "-", input=json.dumps(rival))
        stalled = wait_for(
            "the rival stalled on the queue's claim",
            lambda: (
                (c := condition(thb(cluster, ns, "rival"), "Stalled")).get("reason")
                == "QueueConflict"
                and c
            ),
            120,
            more=more,
        )
        assert "stay-default" in stalled["message"], stalled
        assert set(bindings(database, "stay-default")) == {(DAGS["stay-default"], TASK)}
        assert bindings(database, "rival") == {}

        # Every bundle is reconciled by its own shard only; the standby reconciles nothing.
        wait_for(
            "a few passes of each bundle",
            lambda: (
                passes(default).get("stay-default", 0) >= 3
                and passes(b_leader).get("stay-b", 0) >= 3
            ),
            60,
            more=more,
        )
        assert set(passes(default)) == {"stay-default", "mover"}
        assert set(passes(b_leader)) == {"stay-b", "rival"}
        assert passes(b_standby) == {}

        # A new revision of the mover whose probe answers after 15 s; relabel it to shard b
        # while that probe runs.
        watched = BindingPoll(database, "mover")
        mover_slow = artifact("mover", "slow-answer")
        patch = {"spec": {"source": {"http": {"url": mover_slow[0], "sha256": mover_slow[1]}}}}
        cluster.kubectl("patch", "thb", "mover", "-n", ns, "--type=merge", "-p", json.dumps(patch))
        in_flight = wait_for(
            "the mover's new probe running", lambda: probing(cluster, ns, "mover"), 120, more=more
        )
        # Relabel right after a pass of stay-default ended, so its next pass is an interval
        # (at least 4 s with the jitter) away: a relabel must not wake the old shard's other
        # bundles (only a deletion does).
        before = passes(default)["stay-default"]
        fast_poll("a pass of stay-default", lambda: passes(default)["stay-default"] > before)
        last = passes(default)["stay-default"]
        passed_at = time.monotonic()
        cluster.kubectl("label", "thb", "mover", "-n", ns, f"{names.LABEL_SHARD}=b")
        fast_poll(
            "the default shard let the mover go", lambda: "left shard default" in default.text()
        )
        time.sleep(1.0)  # a woken pass (an unchanged one, tens of ms) would have ended
        after = passes(default)["stay-default"]
        if time.monotonic() - passed_at < 3.8:  # else its own next pass may be due: no telling
            assert after == last, "the relabel woke stay-default in the old shard"
        job = json.loads(cluster.kubectl("get", "job", in_flight, "-n", ns, "-o", "json").stdout)
        assert not (job.get("status") or {}).get("completionTime"), "relabelled too late"

        ready(cluster, ns, "mover", mover_slow[1], b_leader, default)
        watched.stop()
        # The binding rows were there at every read during the move.
        assert watched.reads > 10 and watched.empty == 0, (watched.reads, watched.empty)
        assert set(bindings(database, "mover")) == {(DAGS["mover"], TASK)}
        # The Job was adopted: each probe Job name was created once (one uid), the mover had
        # two Jobs (one per revision), and b's leader says it adopted the running one.
        seen = [(o["metadata"]["name"], o["metadata"]["uid"]) for o in jobs.objects()]
        assert len({name for name, _ in seen}) == len(seen), seen
        movers = [
            o for o in jobs.objects() if o["metadata"]["labels"][names.LABEL_BUNDLE] == "mover"
        ]
        assert len(movers) == 2, seen
        assert f"probe Job {in_flight} adopted" in b_leader.text(), b_leader.tail()
        # The default shard let go of the mover: its series is gone and never comes back,
        # while b passes it.
        wait_for(
            "b's passes of the mover",
            lambda: passes(b_leader).get("mover", 0) >= 3 and "mover" not in passes(default),
            60,
            more=more,
        )
        assert "left shard default" in default.text()
        assert set(passes(default)) == {"stay-default"}

        # b's leader is killed: the standby takes the b Lease and goes on with b's bundles;
        # the default shard's Lease and passes are untouched.
        before_default = passes(default)["stay-default"]
        b_leader.kill()
        took = wait_for(
            "the standby takes the b Lease",
            lambda: (
                min(passes(b_standby).get(name, 0) for name in ("mover", "stay-b", "rival")) >= 1
            ),
            90,
            more=more,
        )
        assert took
        assert lease(cluster, ns, "taskhandler-operator-b")["holderIdentity"] != leases[1]
        assert lease(cluster, ns, "taskhandler-operator")["holderIdentity"] == leases[0]
        assert leader_gauge(b_standby) == {"b": 1.0}
        assert default.alive() and passes(default)["stay-default"] > before_default
        assert set(passes(default)) == {"stay-default"}
        for bundle in DAGS:
            assert condition(thb(cluster, ns, bundle), "Ready").get("status") == "True", bundle
        assert condition(thb(cluster, ns, "rival"), "Stalled").get("reason") == "QueueConflict"
        # The resync listed every 2 s in every leader (the RBAC allows it) and released
        # nothing: the DELETED had let the mover go, and the other bundles are listed.
        for r in everyone:
            assert "resync of its bundles failed" not in r.text(), r.tail()
            assert "not in its listing" not in r.text(), r.tail()
        # No Job was made again by the new leader of b.
        assert [o["metadata"]["uid"] for o in jobs.objects()] == [uid for _, uid in seen]
    finally:
        jobs.stop()

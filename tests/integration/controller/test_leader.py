"""Leader election on a real Lease: one leader, takeover after SIGKILL and after SIGTERM,
losing the Lease stops the work, write conflicts are handled.

Timing assertions are bounds with generous slack (the machine is shared): a takeover after a
graceful stop must come well before the lease could have expired, and one after SIGKILL must
wait for the expiry; neither depends on how fast this run happens to be.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from taskhandler_devenv.kubecluster.bins import REPO_ROOT
from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_operator.controller.kubeapi import Conflict, KubeApi, micro_time
from taskhandler_operator.controller.leader import ElectionConfig, LeaderElector, Outcome
from tests.integration.controller import elector_main
from tests.integration.controller.conftest import eventually

pytestmark = [pytest.mark.kube, pytest.mark.timeout(180)]

Obj = dict[str, Any]
SLACK = 10.0  # seconds of scheduling noise tolerated on a loaded 2-core machine


def fast(namespace: str, identity: str, **overrides: Any) -> ElectionConfig:
    timings: dict[str, Any] = {"lease_duration": 8, "renew_deadline": 5.0, "retry_period": 0.5}
    return ElectionConfig(namespace, "thop-leader", identity, **(timings | overrides))


class Candidate:
    """An in-process elector with its own KubeApi, recording what happened to it."""

    def __init__(self, api: k8s_client.ApiClient, config: ElectionConfig) -> None:
        self.kubeapi = KubeApi(api, max_workers=2, request_timeout=2.0)
        self.elector = LeaderElector(self.kubeapi, config)
        self.started = 0
        self.stopped = 0
        self.work_cancelled = False
        self.task: asyncio.Task[Outcome] | None = None

    async def work(self) -> None:
        self.started += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.work_cancelled = True
            raise

    async def on_stopped(self) -> None:
        self.stopped += 1

    def start(self) -> None:
        self.task = asyncio.create_task(self.elector.run(self.work, self.on_stopped))

    async def outcome(self) -> Outcome:
        assert self.task is not None
        return await asyncio.wait_for(self.task, 60)


@asynccontextmanager
async def candidates(
    api: k8s_client.ApiClient, *configs: ElectionConfig
) -> AsyncIterator[list[Candidate]]:
    running = [Candidate(api, config) for config in configs]
    for candidate in running:
        candidate.start()
    try:
        yield running
    finally:
        for candidate in running:
            candidate.elector.stop()
        for candidate in running:
            if candidate.task is not None:
                await asyncio.wait({candidate.task}, timeout=30)
            await candidate.kubeapi.aclose()


async def lease_of(kubeapi: KubeApi, namespace: str) -> Obj:
    lease = await kubeapi.get_lease(namespace, "thop-leader")
    assert lease is not None
    return lease


async def leader_among(group: list[Candidate]) -> Candidate:
    async def one() -> Candidate | None:
        leading = [c for c in group if c.elector.is_leader]
        return leading[0] if len(leading) == 1 else None

    return await eventually(one, "one candidate to lead", within=30)


async def test_exactly_one_of_three_leads(
    kube_api: k8s_client.ApiClient, kubeapi: KubeApi, kube_namespace: str
) -> None:
    ns = kube_namespace
    configs = [fast(ns, f"pod-{n}_x") for n in range(3)]
    async with candidates(kube_api, *configs) as group:
        leader = await leader_among(group)
        # Watch for a while: never two leaders, the same one throughout, work started once.
        for _ in range(30):
            assert [c for c in group if c.elector.is_leader] == [leader]
            await asyncio.sleep(0.1)
        assert [c.started for c in group].count(1) == 1 and sum(c.started for c in group) == 1
        lease = await lease_of(kubeapi, ns)
        assert lease["spec"]["holderIdentity"] == leader.elector.identity
        assert lease["spec"]["leaseDurationSeconds"] == 8
        assert lease["spec"]["renewTime"].endswith("Z")


async def test_graceful_stop_hands_over_at_once(
    kube_api: k8s_client.ApiClient, kubeapi: KubeApi, kube_namespace: str
) -> None:
    ns = kube_namespace
    async with candidates(kube_api, fast(ns, "a_1"), fast(ns, "b_2")) as group:
        leader = await leader_among(group)
        standby = next(c for c in group if c is not leader)
        transitions = (await lease_of(kubeapi, ns))["spec"].get("leaseTransitions", 0)
        stopped_at = time.monotonic()
        leader.elector.stop()
        assert await leader.outcome() is Outcome.RELEASED
        assert leader.work_cancelled and leader.stopped == 1 and not leader.elector.is_leader

        await eventually(lambda: _true(standby.elector.is_leader), "the standby to lead", within=30)
        took = time.monotonic() - stopped_at
        # Released, not expired: well inside the 8 s lease (typically one 0.5 s retry).
        assert took < 8, f"takeover after a release took {took:.1f}s"
        assert standby.started == 1
        lease = await lease_of(kubeapi, ns)
        assert lease["spec"]["holderIdentity"] == standby.elector.identity
        assert lease["spec"]["leaseTransitions"] == transitions + 1


async def _true(value: bool) -> bool:
    return value


async def test_lease_lost_when_renewal_is_forbidden(
    kube_cluster: KubeCluster, kube_api: k8s_client.ApiClient, kube_namespace: str
) -> None:
    ns = kube_namespace
    rbac = k8s_client.RbacAuthorizationV1Api(kube_api)
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "elector"},
        "rules": [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "verbs": ["get", "create", "update"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "elector"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "elector"},
        "subjects": [
            {"kind": "User", "name": "elector-user", "apiGroup": "rbac.authorization.k8s.io"}
        ],
    }
    rbac.create_namespaced_role(ns, k8s_client.V1Role.model_validate(role))
    rbac.create_namespaced_role_binding(ns, k8s_client.V1RoleBinding.model_validate(binding))
    user_api = k8s_config.new_client_from_config(
        config_file=str(kube_cluster.user_kubeconfig("elector-user"))
    )
    config = fast(ns, "limited_1", lease_duration=6, renew_deadline=3.0)
    try:
        async with candidates(user_api, config) as (candidate,):
            await eventually(lambda: _true(candidate.elector.is_leader), "to lead", within=30)
            revoked_at = time.monotonic()
            rbac.delete_namespaced_role_binding("elector", ns)
            assert await candidate.outcome() is Outcome.LOST
            lost_after = time.monotonic() - revoked_at
            assert candidate.stopped == 1 and candidate.work_cancelled
            assert not candidate.elector.is_leader
            # It gave up at its renew deadline, before the lease a standby honours ran out.
            assert lost_after < 3.0 + SLACK
    finally:
        user_api.close()


def test_lease_lost_while_the_apiserver_is_down(
    kube_cluster: KubeCluster, kube_api: k8s_client.ApiClient, kube_namespace: str
) -> None:
    # The elector runs on a loop in a thread of its own; the outage is made from this (the
    # main) thread, because the fixture ties a restarted apiserver's life to the thread that
    # starts it (PR_SET_PDEATHSIG), and a worker thread would take it down when it exits.
    config = fast(kube_namespace, "cut-off_1", lease_duration=6, renew_deadline=3.0)
    leading = threading.Event()
    result: dict[str, Any] = {}

    async def scenario() -> None:
        async with candidates(kube_api, config) as (candidate,):
            await eventually(lambda: _true(candidate.elector.is_leader), "to lead", within=30)
            leading.set()
            result["outcome"] = await candidate.outcome()
            result["lost_at"] = time.monotonic()
            result["stopped"], result["cancelled"] = candidate.stopped, candidate.work_cancelled

    runner = threading.Thread(target=lambda: asyncio.run(scenario()), name="elector-loop")
    runner.start()
    try:
        assert leading.wait(60), "the elector did not lead"
        killed_at = time.monotonic()
        # The apiserver crashes and stays away longer than the renew deadline.
        kube_cluster.restart_apiserver(down_seconds=3.0 + 4.0)
    finally:
        runner.join(90)
    assert result["outcome"] is Outcome.LOST
    assert result["stopped"] == 1 and result["cancelled"]
    assert result["lost_at"] - killed_at < 3.0 + SLACK


async def test_a_stolen_lease_stops_the_leader(
    kube_api: k8s_client.ApiClient, kubeapi: KubeApi, kube_namespace: str
) -> None:
    ns = kube_namespace
    async with candidates(kube_api, fast(ns, "victim_1")) as (victim,):
        await eventually(lambda: _true(victim.elector.is_leader), "to lead", within=30)
        lease = await lease_of(kubeapi, ns)
        lease["spec"]["holderIdentity"] = "thief_9"
        lease["spec"]["renewTime"] = micro_time()
        await kubeapi.replace_lease(ns, lease)
        assert await victim.outcome() is Outcome.LOST
        assert victim.stopped == 1
        # It did not write the Lease back: the thief still holds it.
        assert (await lease_of(kubeapi, ns))["spec"]["holderIdentity"] == "thief_9"


async def test_an_expired_lease_of_a_crashed_holder_is_taken_over(
    kube_api: k8s_client.ApiClient, kubeapi: KubeApi, kube_namespace: str
) -> None:
    ns = kube_namespace
    # A Lease left by a crashed holder: expired once anyone has watched it unchanged for 1 s.
    await kubeapi.create_lease(
        ns,
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "thop-leader"},
            "spec": {
                "holderIdentity": "crashed_0",
                "leaseDurationSeconds": 1,
                "renewTime": micro_time(),
                "leaseTransitions": 4,
            },
        },
    )
    async with candidates(kube_api, *(fast(ns, f"racer-{n}_r") for n in range(4))) as group:
        leader = await leader_among(group)
        await asyncio.sleep(1.5)
        assert [c for c in group if c.elector.is_leader] == [leader]
        assert sum(c.started for c in group) == 1
        lease = await lease_of(kubeapi, ns)
        assert lease["spec"]["holderIdentity"] == leader.elector.identity
        assert lease["spec"]["leaseTransitions"] == 5


class Interloper:
    """Wraps a candidate's Lease reads (the real calls) to let another writer change the
    Lease right after the candidate read it, so its write carries a stale resourceVersion and
    the apiserver answers 409 -- a write conflict made to happen, not hoped for."""

    def __init__(self, candidate: Candidate, kubeapi: KubeApi, change: Any) -> None:
        self.kubeapi = kubeapi
        self.change = change
        self.armed = False
        self.conflicts = 0
        self._get = candidate.kubeapi.get_lease
        self._replace = candidate.kubeapi.replace_lease
        candidate.kubeapi.get_lease = self.get_lease  # type: ignore[method-assign]
        candidate.kubeapi.replace_lease = self.replace_lease  # type: ignore[method-assign]

    async def get_lease(self, namespace: str, name: str) -> Obj | None:
        lease = await self._get(namespace, name)
        if self.armed and lease is not None:
            self.armed = False
            await self.kubeapi.replace_lease(namespace, self.change(dict(lease)))
        return lease

    async def replace_lease(self, namespace: str, lease: Obj) -> Obj:
        try:
            return await self._replace(namespace, lease)
        except Conflict:
            self.conflicts += 1
            raise


async def test_conflict_while_acquiring_leaves_the_rival_leading(
    kube_api: k8s_client.ApiClient, kubeapi: KubeApi, kube_namespace: str
) -> None:
    ns = kube_namespace
    now = micro_time()
    released = {"leaseDurationSeconds": 1, "renewTime": now, "acquireTime": now}
    await kubeapi.create_lease(
        ns,
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "thop-leader"},
            "spec": released,
        },
    )

    def rival_takes_it(lease: Obj) -> Obj:
        spec = {**lease["spec"], "holderIdentity": "rival_9", "leaseDurationSeconds": 8}
        return {**lease, "spec": spec | {"renewTime": micro_time()}}

    async with candidates(kube_api) as group:
        candidate = Candidate(kube_api, fast(ns, "late_1"))
        group.append(candidate)
        interloper = Interloper(candidate, kubeapi, rival_takes_it)
        interloper.armed = True
        candidate.start()
        await eventually(lambda: _true(interloper.conflicts == 1), "the write conflict")
        await asyncio.sleep(2)  # several retries: it must now wait for the rival's lease
        assert not candidate.elector.is_leader and candidate.started == 0
        assert (await lease_of(kubeapi, ns))["spec"]["holderIdentity"] == "rival_9"
        candidate.elector.stop()
        assert await candidate.outcome() is Outcome.NEVER_LED


async def test_conflict_while_renewing_keeps_leading(
    kube_api: k8s_client.ApiClient, kubeapi: KubeApi, kube_namespace: str
) -> None:
    ns = kube_namespace

    def someone_annotates(lease: Obj) -> Obj:
        meta = {**lease["metadata"], "annotations": {"touched-by": "someone-else"}}
        return {**lease, "metadata": meta}

    async with candidates(kube_api, fast(ns, "steady_1")) as (leader,):
        await eventually(lambda: _true(leader.elector.is_leader), "to lead", within=30)
        interloper = Interloper(leader, kubeapi, someone_annotates)
        interloper.armed = True
        await eventually(lambda: _true(interloper.conflicts == 1), "the renewal to conflict")
        before = (await lease_of(kubeapi, ns))["spec"]["renewTime"]
        await eventually(
            lambda: _renewed_since(kubeapi, ns, before), "a renewal after the conflict"
        )
        # One failed write is no reason to stop: the holder is still us, the next renew works.
        assert leader.elector.is_leader and leader.stopped == 0 and leader.started == 1
        lease = await lease_of(kubeapi, ns)
        assert lease["spec"]["holderIdentity"] == "steady_1"
        assert lease["metadata"]["annotations"] == {"touched-by": "someone-else"}


async def _renewed_since(kubeapi: KubeApi, ns: str, before: str) -> bool:
    return bool((await lease_of(kubeapi, ns))["spec"]["renewTime"] > before)


async def test_work_that_fails_releases_and_raises(
    kube_api: k8s_client.ApiClient, kubeapi: KubeApi, kube_namespace: str
) -> None:
    ns = kube_namespace
    elector_api = KubeApi(kube_api, max_workers=2)
    elector = LeaderElector(elector_api, fast(ns, "fails_1"))
    stopped: list[bool] = []

    async def work() -> None:
        raise RuntimeError("startup failed: database unreachable")

    async def on_stopped() -> None:
        stopped.append(True)

    try:
        with pytest.raises(RuntimeError, match="database unreachable"):
            await asyncio.wait_for(elector.run(work, on_stopped), 60)
    finally:
        await elector_api.aclose()
    assert stopped == [True]
    lease = await lease_of(kubeapi, ns)
    assert "holderIdentity" not in lease["spec"] and lease["spec"]["leaseDurationSeconds"] == 1


async def test_cancelling_run_releases(
    kube_api: k8s_client.ApiClient, kubeapi: KubeApi, kube_namespace: str
) -> None:
    ns = kube_namespace
    async with candidates(kube_api, fast(ns, "cancelled_1")) as (candidate,):
        await eventually(lambda: _true(candidate.elector.is_leader), "to lead", within=30)
        assert candidate.task is not None
        candidate.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await candidate.task
        assert candidate.work_cancelled and candidate.stopped == 1
    lease = await lease_of(kubeapi, ns)
    assert "holderIdentity" not in lease["spec"]


# --- two processes: SIGKILL and SIGTERM --------------------------------------------------------


class Proc:
    def __init__(self, kube_cluster: KubeCluster, namespace: str, identity: str) -> None:
        self.identity = identity
        self.lines: list[str] = []
        self.popen = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.controller.elector_main",
                str(kube_cluster.kubeconfig),
                namespace,
                "thop-leader",
                identity,
            ],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._reader = asyncio.get_running_loop().run_in_executor(None, self._read)

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line.strip())

    async def said(self, text: str) -> bool:
        return text in self.lines

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=30)


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.stop()


async def test_processes_sigkill_then_sigterm(
    kube_cluster: KubeCluster, kubeapi: KubeApi, kube_namespace: str, procs: list[Proc]
) -> None:
    ns = kube_namespace
    first = Proc(kube_cluster, ns, "first_1")
    procs.append(first)
    await eventually(lambda: first.said("LEADING"), "the first process to lead", within=60)
    second = Proc(kube_cluster, ns, "second_2")
    procs.append(second)

    async def holder() -> str:
        return str((await lease_of(kubeapi, ns))["spec"].get("holderIdentity", ""))

    # The second one is a standby: it runs, and the first keeps the Lease.
    await asyncio.sleep(2)
    assert second.popen.poll() is None and not await second.said("LEADING")
    assert await holder() == "first_1"

    killed_at = time.monotonic()
    os.kill(first.popen.pid, signal.SIGKILL)
    await eventually(lambda: second.said("LEADING"), "the standby to take over", within=60)
    took = time.monotonic() - killed_at
    duration, retry = elector_main.LEASE_DURATION, elector_main.RETRY_PERIOD
    # Nobody released the Lease, so the standby had to wait for it to expire ...
    assert took >= duration - 2 * retry, f"took over after {took:.1f}s, before the lease expired"
    # ... and took it at its first retry after that.
    assert took <= duration + retry * 1.2 + SLACK
    assert await holder() == "second_2"

    # SIGTERM: a graceful stop releases the Lease and exits cleanly.
    second.popen.send_signal(signal.SIGTERM)
    assert second.popen.wait(timeout=60) == 0
    await eventually(lambda: second.said("OUTCOME released"), "the release to be reported")
    lease = await lease_of(kubeapi, ns)
    assert "holderIdentity" not in lease["spec"] and lease["spec"]["leaseDurationSeconds"] == 1

    # A third candidate now takes the released Lease at once, not after a lease duration.
    started_at = time.monotonic()
    third = Proc(kube_cluster, ns, "third_3")
    procs.append(third)
    await eventually(lambda: third.said("LEADING"), "a new candidate to take the released Lease")
    assert await holder() == "third_3"
    after_release = time.monotonic() - started_at
    print(f"SIGKILL takeover {took:.1f}s; new candidate after a release {after_release:.1f}s")


async def test_the_term_is_the_leases_and_step_down_ends_leading_without_releasing(
    kube_api: k8s_client.ApiClient, kubeapi: KubeApi, kube_namespace: str
) -> None:
    """The leader fence's token (db/fence.py) comes from the Lease; a replica the fence refuses
    stops leading at once, as on a lost Lease, and leaves the Lease alone."""
    ns = kube_namespace
    async with candidates(kube_api, fast(ns, "a_1"), fast(ns, "b_2")) as group:
        leader = await leader_among(group)
        standby = next(c for c in group if c is not leader)
        assert standby.elector.term is None
        lease = await lease_of(kubeapi, ns)
        term = leader.elector.term
        assert term is not None
        assert term.lease_uid == lease["metadata"]["uid"]
        assert term.holder == leader.elector.identity
        assert term.transitions == lease["spec"].get("leaseTransitions", 0)

        leader.elector.step_down("the database fences writes to someone else")
        assert await leader.outcome() is Outcome.LOST
        assert leader.work_cancelled and leader.stopped == 1 and leader.elector.term is None
        # Not released: the Lease still names it until it expires (the standby waits for that).
        assert (await lease_of(kubeapi, ns))["spec"]["holderIdentity"] == leader.elector.identity
        await eventually(lambda: _true(standby.elector.is_leader), "the standby to lead", within=30)
        taken = standby.elector.term
        assert taken is not None and taken.transitions == term.transitions + 1
        assert taken.lease_uid == term.lease_uid

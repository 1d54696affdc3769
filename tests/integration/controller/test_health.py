"""The health server on loopback, queried with a real HTTP client."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from kubernetes import client as k8s_client
from prometheus_client import CollectorRegistry

from taskhandler_operator.controller.health import (
    HealthServer,
    HealthState,
    Heartbeat,
    PassWatch,
    Readiness,
    tick,
)
from taskhandler_operator.controller.kubeapi import KubeApi
from taskhandler_operator.controller.leader import ElectionConfig, LeaderElector
from taskhandler_operator.controller.metrics import Metrics
from tests.integration.controller.conftest import eventually

#: The leader gauge of the default shard (Metrics() without a shard).
LEADER = {"shard": "default"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def serving(
    state: HealthState, registry: CollectorRegistry | None = None
) -> AsyncIterator[Callable[..., Awaitable[tuple[int, Any, str]]]]:
    server = HealthServer(state, registry or CollectorRegistry(), host="127.0.0.1", port=0)
    port = await server.start()
    async with aiohttp.ClientSession() as session:

        async def get(path: str, **kwargs: Any) -> tuple[int, Any, str]:
            async with session.get(f"http://127.0.0.1:{port}{path}", **kwargs) as response:
                body = await response.text()
                parsed = (
                    await response.json() if response.content_type == "application/json" else body
                )
                return response.status, parsed, response.headers.get("Content-Type", "")

        try:
            yield get
        finally:
            await server.stop()


async def test_metrics_endpoint_serves_the_registry() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.observe_reconcile("ns", "go", "success", 0.2)
    metrics.set_bindings("ns", "go", 12)
    async with serving(HealthState(), metrics.registry) as get:
        status, body, content_type = await get("/metrics")
        assert status == 200 and content_type.startswith("text/plain")
        assert 'taskhandler_operator_bindings{name="go",namespace="ns"} 12.0' in body
        assert "taskhandler_operator_reconcile_duration_seconds_bucket" in body
        status, body, content_type = await get(
            "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        assert status == 200 and content_type.startswith("application/openmetrics-text")
        assert body.rstrip().endswith("# EOF")
        # prometheus-client's name[] filter (the benchmarks read two families this way).
        status, body, _ = await get(
            "/metrics", params=[("name[]", "taskhandler_operator_bindings")]
        )
        assert status == 200 and "taskhandler_operator_bindings{" in body
        assert "reconcile_duration" not in body


async def test_liveness_follows_armed_heartbeats() -> None:
    clock = Clock()
    state = HealthState()
    elector = state.add(Heartbeat("elector", 10, clock=clock))
    watch = state.add(Heartbeat("watch", 60, armed=False, clock=clock))
    async with serving(state) as get:
        status, body, _ = await get("/healthz")
        assert status == 200 and body["status"] == "ok"

        clock.now += 100  # nothing beat for 100 s; only the armed one counts
        status, body, _ = await get("/healthz")
        assert status == 503 and body["status"] == "stale"
        assert body["heartbeats"]["elector"] == {
            "ok": False,
            "armed": True,
            "ageSeconds": 100.0,
            "maxAgeSeconds": 10,
        }
        assert body["heartbeats"]["watch"]["ok"] is True  # disarmed (a standby runs no watchers)

        elector.beat()
        watch.arm()  # became leader: the watch loop must now keep beating
        assert (await get("/healthz"))[0] == 200
        clock.now += 61
        elector.beat()
        status, body, _ = await get("/healthz")
        assert status == 503 and body["heartbeats"]["watch"]["ok"] is False  # a dead watcher


def _get_from_another_thread(port: int) -> tuple[int, Any]:
    """GET /healthz with a blocking client (the test's event loop is the one being blocked)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def test_a_blocked_event_loop_reads_as_a_named_503() -> None:
    """The server answers from its own thread: a loop that stopped running its ticker is a
    stale ``event-loop`` check, not a probe timeout."""
    state = HealthState()
    beat = state.add(Heartbeat("event-loop", 0.5))
    ticker = asyncio.create_task(tick(beat, 0.05))
    server = HealthServer(state, CollectorRegistry(), host="127.0.0.1", port=0)
    port = await server.start()
    try:
        await asyncio.sleep(0.2)
        assert (await asyncio.to_thread(_get_from_another_thread, port))[0] == 200
        answers: list[tuple[int, Any]] = []

        def later() -> None:
            time.sleep(1.0)  # the loop has been blocked for a second by then
            answers.append(_get_from_another_thread(port))

        probe = threading.Thread(target=later)
        probe.start()
        time.sleep(1.5)  # noqa: ASYNC251 - blocking the loop is the point
        probe.join(5)
        status, body = answers[0]
        assert status == 503 and body["heartbeats"]["event-loop"]["ok"] is False
        await asyncio.sleep(0.2)  # the loop runs again: so does the ticker
        assert (await asyncio.to_thread(_get_from_another_thread, port))[0] == 200
    finally:
        ticker.cancel()
        await server.stop()


async def test_an_idle_operator_is_live_whatever_the_clock_says() -> None:
    clock = Clock()
    state = HealthState()
    watch = state.add(PassWatch("reconcilers", 600, clock=clock))
    async with serving(state) as get:
        clock.now += 7 * 86400  # a week without a single pass
        status, body, _ = await get("/healthz")
        assert status == 200 and body["heartbeats"]["reconcilers"]["ageSeconds"] == 0.0
        with watch.busy(("ns", "stuck")):
            clock.now += 601
            status, body, _ = await get("/healthz")
            assert status == 503 and body["heartbeats"]["reconcilers"]["ok"] is False


async def test_readiness_needs_started_live_and_leading() -> None:
    clock = Clock()
    leading = False
    state = HealthState(leading=lambda: leading)
    beat = state.add(Heartbeat("elector", 10, clock=clock))
    async with serving(state) as get:
        status, body, _ = await get("/readyz")
        assert (status, body["status"], body["started"]) == (503, "not ready", False)

        state.started = True
        status, body, _ = await get("/readyz")
        assert status == 503 and body["leader"] is False and body["policy"] == "leader"

        leading = True
        status, body, _ = await get("/readyz")
        assert status == 200 and body["status"] == "ready"

        clock.now += 11  # live no more: not ready either
        assert (await get("/readyz"))[0] == 503
        beat.beat()
        assert (await get("/readyz"))[0] == 200


async def test_started_policy_counts_a_standby_ready() -> None:
    state = HealthState(readiness=Readiness.STARTED, started=True, leading=lambda: False)
    async with serving(state) as get:
        status, body, _ = await get("/readyz")
        assert status == 200 and body["leader"] is False and body["policy"] == "started"


async def test_unknown_path_is_404() -> None:
    async with serving(HealthState()) as get:
        assert (await get("/nope"))[0] == 404


async def test_a_taken_port_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = HealthServer(HealthState(), CollectorRegistry(), host="127.0.0.1", port=port)
        with pytest.raises(OSError, match=f"health endpoint cannot listen on 127.0.0.1:{port}"):
            await server.start()


def test_bad_heartbeat_is_refused() -> None:
    with pytest.raises(ValueError, match="max_age must be positive"):
        Heartbeat("x", 0)


async def _forever() -> None:
    await asyncio.Event().wait()


@pytest.mark.kube
@pytest.mark.timeout(120)
async def test_only_the_leader_is_ready(
    kube_api: k8s_client.ApiClient, kube_namespace: str
) -> None:
    """Two replicas wired as the operator wires them: elector -> readiness, heartbeat, gauge."""
    replicas = []
    for identity in ("one_1", "two_2"):
        kubeapi = KubeApi(kube_api, max_workers=2, request_timeout=2.0)
        metrics = Metrics(CollectorRegistry())
        state = HealthState(started=True)
        beat = state.add(Heartbeat("elector", 5))
        config = ElectionConfig(
            kube_namespace,
            "ready-test",
            identity,
            lease_duration=8,
            renew_deadline=5,
            retry_period=0.5,
        )
        elector = LeaderElector(kubeapi, config, on_tick=beat.beat, on_leading=metrics.set_leader)
        state.leading = lambda elector=elector: elector.is_leader  # type: ignore[misc]
        server = HealthServer(state, metrics.registry, host="127.0.0.1", port=0)
        port = await server.start()
        task = asyncio.create_task(elector.run(_forever))
        replicas.append((elector, server, port, task, kubeapi, metrics))

    async def ready(port: int) -> int:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/readyz") as response,
        ):
            return response.status

    try:

        async def one_ready() -> tuple[int, int] | None:
            codes = (await ready(replicas[0][2]), await ready(replicas[1][2]))
            return codes if sorted(codes) == [200, 503] else None

        codes = await eventually(one_ready, "exactly one replica ready", within=30)
        leader_index = codes.index(200)
        leader, standby = replicas[leader_index], replicas[1 - leader_index]
        assert leader[0].is_leader and not standby[0].is_leader
        assert leader[5].registry.get_sample_value("taskhandler_operator_leader", LEADER) == 1
        assert standby[5].registry.get_sample_value("taskhandler_operator_leader", LEADER) == 0

        leader[0].stop()
        await asyncio.wait_for(leader[3], 30)

        async def handed_over() -> bool:
            return await ready(standby[2]) == 200 and await ready(leader[2]) == 503

        await eventually(handed_over, "the standby to become ready", within=30)
    finally:
        for elector, server, _, task, kubeapi, _ in replicas:
            elector.stop()
            await asyncio.wait({task}, timeout=30)
            await server.stop()
            await kubeapi.aclose()

"""The process node's probe scheduling and restart back-off (devenv/kubecluster/probes.py), on
plain numbers for the clock: the kubelet's rules, one at a time."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from taskhandler_devenv.kubecluster.podstatus import (
    Conditions,
    ContainerRecord,
    pod_conditions,
)
from taskhandler_devenv.kubecluster.probeexec import resolve_port, run_probe
from taskhandler_devenv.kubecluster.probes import (
    LIVENESS,
    READINESS,
    STARTUP,
    ContainerProbes,
    ProbeSpec,
    RestartBackoff,
)


def container(**probes: Any) -> dict[str, Any]:
    return {"name": "c", "ports": [{"name": "health", "containerPort": 8081}], **probes}


HTTP = {"httpGet": {"path": "/healthz", "port": "health"}}


def test_spec_defaults_are_the_apis() -> None:
    spec = ProbeSpec.of(container(livenessProbe=HTTP), LIVENESS)
    assert spec is not None
    assert (spec.handler, spec.initial_delay, spec.period, spec.timeout) == ("httpGet", 0, 10, 1)
    assert (spec.success_threshold, spec.failure_threshold, spec.grace) == (1, 3, None)
    assert ProbeSpec.of(container(), READINESS) is None
    # successThreshold is 1 for liveness and startup whatever the manifest says.
    odd = ProbeSpec.of(container(livenessProbe={**HTTP, "successThreshold": 3}), LIVENESS)
    assert odd is not None and odd.success_threshold == 1


def test_liveness_kills_after_failure_threshold_consecutive_failures() -> None:
    probe = {**HTTP, "initialDelaySeconds": 10, "periodSeconds": 20, "failureThreshold": 3}
    probes = ContainerProbes.begin(container(livenessProbe=probe), started_at=100.0)
    assert probes.started and probes.ready  # no startup and no readiness probe
    assert probes.due(109.9) == [] and [p.spec.kind for p in probes.due(110.0)] == [LIVENESS]
    probes.record(LIVENESS, False, 110.0)
    assert probes.kill_reason() is None and probes.due(129.0) == []
    probes.record(LIVENESS, True, 130.0)  # a success resets the count
    probes.record(LIVENESS, False, 150.0)
    probes.record(LIVENESS, False, 170.0)
    assert probes.kill_reason() is None
    probes.record(LIVENESS, False, 190.0)
    victim = probes.kill_reason()
    assert victim is not None and victim.spec.kind == LIVENESS


def test_readiness_starts_unready_and_follows_its_thresholds() -> None:
    probe = {**HTTP, "periodSeconds": 5, "successThreshold": 2, "failureThreshold": 2}
    probes = ContainerProbes.begin(container(readinessProbe=probe), started_at=0.0)
    assert probes.started and not probes.ready
    probes.record(READINESS, True, 0.0)
    assert not probes.ready
    probes.record(READINESS, True, 5.0)
    assert probes.ready
    probes.record(READINESS, False, 10.0)
    assert probes.ready  # one failure of two
    probes.record(READINESS, False, 15.0)
    assert not probes.ready and probes.kill_reason() is None  # unready, never killed


def test_startup_probe_gates_the_others_and_kills_when_it_never_passes() -> None:
    startup = {**HTTP, "periodSeconds": 1, "failureThreshold": 3}
    liveness = {**HTTP, "initialDelaySeconds": 5, "periodSeconds": 10}
    spec = container(startupProbe=startup, livenessProbe=liveness, readinessProbe=HTTP)
    probes = ContainerProbes.begin(spec, started_at=0.0)
    assert not probes.started and not probes.ready
    assert [p.spec.kind for p in probes.due(100.0)] == [STARTUP]
    probes.record(STARTUP, False, 0.0)
    probes.record(STARTUP, True, 1.0)
    assert probes.started and not probes.ready  # readiness still to pass
    # The others count from the start: liveness's initial delay runs from t=1.
    assert [p.spec.kind for p in probes.due(1.0)] == [READINESS]
    assert LIVENESS in [p.spec.kind for p in probes.due(6.0)]

    never = ContainerProbes.begin(spec, started_at=0.0)
    for t in (0.0, 1.0):
        never.record(STARTUP, False, t)
    assert never.kill_reason() is None
    never.record(STARTUP, False, 2.0)
    victim = never.kill_reason()
    assert victim is not None and victim.spec.kind == STARTUP


def test_crash_loop_back_off_doubles_to_its_cap_and_forgives() -> None:
    backoff = RestartBackoff(initial=10, cap=300)
    delays = [backoff.next_delay("c", t) for t in (0, 1, 12, 33, 74, 155, 316, 617, 918)]
    assert delays == [0, 10, 20, 40, 80, 160, 300, 300, 300]
    assert backoff.next_delay("other", 918) == 0  # per container
    assert backoff.next_delay("c", 918 + 601) == 0  # ran longer than twice the cap


def test_readiness_drives_container_and_pod_conditions() -> None:
    rec = ContainerRecord("c", "busybox", init=False)
    rec.set_running(42, probed_ready=True)
    conds = Conditions()
    status = rec.status("uid")
    assert status["started"] is True and status["ready"] is False
    ready = {c["type"]: c["status"] for c in pod_conditions(conds, [], [rec], "Running", True, [])}
    assert ready["Ready"] == ready["ContainersReady"] == "False"
    rec.probe_ready = True
    ready = {c["type"]: c["status"] for c in pod_conditions(conds, [], [rec], "Running", True, [])}
    assert ready["Ready"] == ready["ContainersReady"] == "True"
    rec.set_running(43, probed_start=True)
    assert rec.status("uid")["started"] is False and rec.status("uid")["ready"] is False


def test_back_off_keeps_the_termination_as_last_state_and_counts_the_restart() -> None:
    rec = ContainerRecord("c", "busybox", init=False)
    rec.set_running(1)
    rec.set_terminated(137, "Error", "")
    rec.back_off("back-off 10s restarting failed container=c pod=p_ns(uid)")
    status = rec.status("uid")
    assert status["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert status["lastState"]["terminated"]["exitCode"] == 137
    assert status["restartCount"] == 0
    rec.restart()
    assert rec.restart_count == 1 and rec.last_terminated is not None
    assert rec.last_terminated["exitCode"] == 137


def test_named_ports_and_handlers() -> None:
    assert resolve_port("health", container()) == 8081
    assert resolve_port(9000, container()) == 9000
    assert resolve_port("9001", container()) == 9001
    with pytest.raises(ValueError, match="'nope' not found"):
        resolve_port("nope", container())
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    spec = ProbeSpec.of(container(livenessProbe={"tcpSocket": {"port": port}}), LIVENESS)
    assert spec is not None
    ok, message = run_probe(spec, container(), pod_ip="127.0.0.1", exec_runner=_no_exec)
    assert not ok and message == f"dial tcp 127.0.0.1:{port}: connect: connection refused"
    exec_spec = ProbeSpec.of(container(readinessProbe={"exec": {"command": ["check"]}}), READINESS)
    assert exec_spec is not None
    assert run_probe(exec_spec, container(), pod_ip="x", exec_runner=lambda a, t: (0, "")) == (
        True,
        "",
    )
    assert run_probe(exec_spec, container(), pod_ip="x", exec_runner=lambda a, t: (1, "no\n")) == (
        False,
        "no",
    )
    assert not run_probe(exec_spec, container(), pod_ip="x", exec_runner=lambda a, t: (None, ""))[0]


def _no_exec(argv: Any, timeout: float) -> tuple[int | None, str]:
    raise AssertionError("no exec expected")

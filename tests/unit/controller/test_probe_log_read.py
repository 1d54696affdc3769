"""How JobProber classifies a finished Job's log read (issue 20, item 6): a transient failure of
the apiserver or the kubelet is never the artifact's fault. The Kubernetes calls are replaced by
a scripted stand-in (a unit test of that decision only; tests/e2e/test_probe_jobs.py reads a
log through a real node whose log server is down)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, cast

import pytest

from taskhandler_operator.artifacts.models import Candidate, Language
from taskhandler_operator.controller.backoff import Backoff, JobSlots, ProbeRetries
from taskhandler_operator.controller.kubeapi import (
    ApiRefused,
    ApiUnavailable,
    JobCreated,
    KubeApiError,
    LogText,
    NotFound,
)
from taskhandler_operator.controller.metrics import Metrics
from taskhandler_operator.controller.probing import JobProber, JobSignals
from taskhandler_operator.kube.probe_job import BundleIdentity
from taskhandler_operator.kube.spec import TaskHandlerBundleSpec
from taskhandler_operator.protocol.messages import TaskHandlerParsingResult
from taskhandler_operator.protocol.summary import (
    RESULT_MARKER,
    ProbeSummary,
    result_line,
    sha256_text,
)
from taskhandler_operator.reconcile.models import ProbeAccepted, ProbeFailed, ProbeRequest
from taskhandler_operator.sources.store import RevisionStore
from tests.unit.kube.examples import bundle_body

RESULT = TaskHandlerParsingResult.model_validate({"task_handlers": {"etl": []}})
LINE = result_line(RESULT)
SUMMARY = ProbeSummary(
    status="ok",
    artifact="/bundle/extract",
    language="go",
    result_sha256=sha256_text(LINE),
    result_bytes=len(LINE),
)


class Kube:
    """Answers as a cluster where the Job completed; the log read does what ``log`` says."""

    def __init__(self, log: bytes | KubeApiError) -> None:
        self.log = log
        self.deleted: list[str] = []
        self.log_reads = 0

    async def create_job(self, namespace: str, manifest: dict[str, Any]) -> JobCreated:
        return JobCreated(manifest, created=True)

    async def list_jobs(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return []  # no Job of the bundle was running before this pass

    async def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name},
            "status": {"conditions": [{"type": "Complete", "status": "True"}]},
        }

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        probe = {"exitCode": 0, "reason": "Completed", "message": SUMMARY.to_json()}
        return [
            {
                "metadata": {"name": "p-1", "creationTimestamp": "2026-01-01T00:00:00Z"},
                "status": {
                    "phase": "Succeeded",
                    "containerStatuses": [{"name": "probe", "state": {"terminated": probe}}],
                },
            }
        ]

    async def stream_container_log(
        self, namespace: str, pod: str, container: str, consume: Any, *, limit_bytes: int
    ) -> int:
        self.log_reads += 1
        if isinstance(self.log, KubeApiError):
            raise self.log
        consume(self.log)
        return len(self.log)

    async def read_container_log(self, namespace: str, pod: str, container: str, **_: Any) -> Any:
        # The whole-log read of earlier versions (kept so the test shows how they answered).
        self.log_reads += 1
        if isinstance(self.log, KubeApiError):
            raise self.log
        return LogText(self.log.decode(), truncated=False)

    async def delete_job(self, namespace: str, name: str) -> bool:
        self.deleted.append(name)
        return True


class Artifacts:
    # The revision store the prober holds a revision in while it probes (never pruned here).
    store = RevisionStore(Path("/nonexistent"))

    async def manifest_entry(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"path": "extract", "url": "http://x/extract", "sha256": "d" * 64, "size": 10}


def prober(kube: Kube) -> JobProber:
    return JobProber(
        kube=cast(Any, kube),
        artifacts=cast(Any, Artifacts()),
        slots=JobSlots(4),
        signals=JobSignals(),
        metrics=Metrics(),
        bundle=BundleIdentity("ns", "etl", "uid-1", "etl-bundle"),
        spec=TaskHandlerBundleSpec.model_validate(bundle_body()["spec"]),
        operator_image="operator:1",
        runtime_images={},
        poll_seconds=0.01,
        retries=ProbeRetries(Backoff(base=30, cap=60), random.Random(1)),
    )


def request() -> ProbeRequest:
    return ProbeRequest("etl-bundle", Language.GO, Path("/r"), Candidate("extract", 10, "d"), "r1")


@pytest.mark.parametrize(
    "error",
    [
        ApiUnavailable(
            "read log: the server is currently unable to handle the request", status=503
        ),
        ApiUnavailable("read log: Too many requests", status=429),
        ApiUnavailable("read log: apiserver unavailable: connection refused"),
        ApiUnavailable(
            'read log: Get "https://127.0.0.1:1/containerLogs/ns/p-1/probe": dial tcp '
            "127.0.0.1:1: connect: connection refused",
            status=500,
        ),
    ],
)
async def test_a_transient_log_read_failure_takes_the_probe_back_off(error: KubeApiError) -> None:
    kube = Kube(error)
    probe = prober(kube)
    out = await probe(request())
    assert isinstance(out, ProbeFailed) and out.retryable
    assert probe.codes["extract"] == "TransientApiError"
    assert "transient" in out.reason and "not at fault" in out.reason
    assert "next attempt after" in out.reason
    # The finished Job stays: the next attempt adopts it and reads its log again.
    assert kube.deleted == []
    # Until the back-off ends, passes neither create a Job nor read a log.
    again = await probe(request())
    assert again == out and kube.log_reads == 1


async def test_a_refused_log_read_is_not_the_artifacts_fault_either() -> None:
    probe = prober(Kube(ApiRefused("read log: forbidden", status=403)))
    out = await probe(request())
    assert isinstance(out, ProbeFailed) and out.retryable
    assert probe.codes["extract"] == "ProbeLogUnreadable"


async def test_a_log_gone_with_its_pod_is_a_lost_pod() -> None:
    kube = Kube(NotFound("read log: pods p-1 not found", status=404))
    probe = prober(kube)
    out = await probe(request())
    assert isinstance(out, ProbeFailed) and out.retryable
    assert probe.codes["extract"] == "PodLost"


async def test_the_log_that_was_read_decides() -> None:
    good = f"starting\n{RESULT_MARKER}\n{LINE}\n".encode()
    accepted = await prober(Kube(good))(request())
    assert isinstance(accepted, ProbeAccepted) and accepted.result == RESULT
    probe = prober(Kube(f"{RESULT_MARKER}\n{LINE[:-1]}\n".encode()))
    rejected = await probe(request())
    assert isinstance(rejected, ProbeFailed) and not rejected.retryable
    assert probe.codes["extract"] == "ResultRejected"

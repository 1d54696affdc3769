"""JobProber's use of the operator-wide probe-Job cap and of the revision store's holds: the
decisions around one probe, with the Kubernetes list replaced by a scripted answer (a unit test
of that logic; the Jobs themselves run in tests/e2e)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from taskhandler_operator.artifacts.models import Candidate, Language
from taskhandler_operator.controller.backoff import JobSlots
from taskhandler_operator.controller.probing import JobProber, JobSignals
from taskhandler_operator.kube.probe_job import BundleIdentity
from taskhandler_operator.reconcile.models import ProbeAccepted, ProbeFailed, ProbeRequest
from taskhandler_operator.sources.store import RevisionStore


def job(name: str, finished: str | None = None, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    conditions = [{"type": finished, "status": "True"}] if finished else []
    return {"metadata": meta, "status": {"conditions": conditions}}


class Listing:
    """The apiserver's answer to the bundle's Job list; counts the lists."""

    def __init__(self, jobs: list[dict[str, Any]]) -> None:
        self.jobs = jobs
        self.selectors: list[str] = []

    async def list_jobs(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        self.selectors.append(label_selector)
        return self.jobs


def prober(name: str, kube: Listing, slots: JobSlots, parallelism: int = 4) -> JobProber:
    spec = SimpleNamespace(probe=SimpleNamespace(parallelism=parallelism))
    return JobProber(
        kube=cast(Any, kube),
        artifacts=cast(Any, None),
        slots=slots,
        signals=JobSignals(),
        metrics=cast(Any, None),
        bundle=BundleIdentity("ns", name, f"uid-{name}", name),
        spec=cast(Any, spec),
        operator_image="op",
        runtime_images={},
        poll_seconds=0.05,
    )


async def test_jobs_running_in_the_cluster_count_against_the_cap() -> None:
    """A restarted operator finds two Jobs of bundle a still running (and two that are not):
    with a cap of 2, bundle b may not start one until they finish, while a adopts its own."""
    slots = JobSlots(capacity=2)
    listed = Listing(
        [
            job("a-1"),
            job("a-2"),
            job("a-3", "Complete"),
            job("a-4", "Failed"),
            job("a-5", deleting=True),
        ]
    )
    a = prober("a", listed, slots)
    await a._take_slot("a-1")  # adopted: it runs already, its slot is the observed one
    assert slots.held(("ns", "a")) == {"a-1", "a-2"}
    assert listed.selectors == [
        "app.kubernetes.io/managed-by=taskhandler-operator,"
        "app.kubernetes.io/name=taskhandler-probe,langsdk.dev/bundle-uid=uid-a"
    ]
    await a._take_slot("a-2")
    assert len(listed.selectors) == 1  # listed once per pass

    b = prober("b", Listing([]), slots)
    waiting = asyncio.create_task(b._take_slot("b-1"))
    await asyncio.sleep(0.2)
    assert not waiting.done()  # the cap is full of a's running Jobs
    slots.release(("ns", "a"), "a-2")  # its Job finished (the watch, or a's pass)
    await asyncio.wait_for(waiting, 2)
    assert slots.held(("ns", "b")) == {"b-1"}


async def test_without_observing_the_running_jobs_were_not_counted() -> None:
    """The failure this guards against: before, nothing called JobSlots.observe, so Jobs left
    running by a previous process left the whole cap free to new ones."""
    slots = JobSlots(capacity=1)
    a = prober("a", Listing([job("a-old")]), slots)
    await a._observe_running()
    assert slots.available == 0
    assert not slots.acquire(("ns", "b"), "b-1", 4)


def view(name: str, uid: str, finished: str | None = None) -> dict[str, Any]:
    """A Job as the watch's index keeps it (``job_view``): its labels say whose it is."""
    got = job(name, finished)
    got["metadata"]["labels"] = {"langsdk.dev/bundle-uid": uid}
    return got


async def test_with_the_job_watch_a_pass_lists_only_when_its_index_shows_a_running_job() -> None:
    """kopf fills the watch's index from its first listing before any bundle's pass runs: when
    it shows no running Job of the bundle beyond the ones this process holds there is nothing to
    count, and no list; when it shows one, the list (the authority: an index entry can outlive
    its Job) counts them."""
    slots = JobSlots(capacity=3)
    listed = Listing([])
    a = prober("a", listed, slots)
    quiet = {
        ("ns", "a-2"): [view("a-2", "uid-a", "Complete")],
        ("ns", "b-1"): [view("b-1", "uid-b")],  # another bundle's
        ("other", "a-3"): [view("a-3", "uid-a")],  # another namespace
    }
    a.signals.attach(quiet, {})
    await a._take_slot("a-9")
    assert listed.selectors == []  # no request
    assert slots.held(("ns", "a")) == {"a-9"}

    listed = Listing([job("a-1"), job("a-2", "Complete")])
    again = prober("a", listed, slots)  # the next pass, while a-1 of another process runs
    again.signals.attach({**quiet, ("ns", "a-1"): [view("a-1", "uid-a")]}, {})
    await again._take_slot("a-8")
    assert len(listed.selectors) == 1
    assert slots.held(("ns", "a")) == {"a-1", "a-8", "a-9"}
    assert slots.available == 0


class Holding(JobProber):
    """_probe answers at once, recording which revisions the store held meanwhile."""

    def __init__(self, store: RevisionStore) -> None:
        self.bundle = BundleIdentity("ns", "b", "uid", "b")
        self.artifacts = cast(Any, SimpleNamespace(store=store))
        self.retries = None
        self.codes = {}
        self.seen: set[str] = set()

    async def _probe(self, request: ProbeRequest) -> ProbeAccepted | ProbeFailed:
        self.seen = self.artifacts.store.held("ns", "b")
        return ProbeFailed(request.candidate.rel_path, "done")


async def test_the_revision_is_held_while_its_probe_runs(tmp_path: Path) -> None:
    store = RevisionStore(tmp_path)
    holding = Holding(store)
    request = ProbeRequest("b", Language.GO, tmp_path, Candidate("x", 1, "d"), "rev-1")
    await holding(request)
    assert holding.seen == {"rev-1"}  # prune keeps it while the pod may download it
    assert store.held("ns", "b") == set()

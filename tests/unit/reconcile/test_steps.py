"""The whole reconcile pass with in-memory ports: a fake prober, store and clock.

The listing and validation are the real pure cores, run on real artifact files in a temporary
folder; only the I/O at the edges (probing, the database, time) is replaced. The same pass
against the real PostgreSQL and the real probe driver is tests/integration/test_reconcile_pass.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from taskhandler_devenv.packers import write_typescript_bundle
from taskhandler_operator.airflow.serialized import DagReadProblem, DagStubs, StubTask
from taskhandler_operator.artifacts.models import Language
from taskhandler_operator.db.claims import BundleClaimed
from taskhandler_operator.db.engine import DatabaseUnavailable
from taskhandler_operator.db.fence import FencedOut
from taskhandler_operator.db.write_models import BundlePass, PassResult
from taskhandler_operator.protocol.messages import TaskHandlerParsingResult
from taskhandler_operator.reconcile.errors import (
    DatabaseFailed,
    Deposed,
    OwnershipConflict,
    PassError,
    PassTimedOut,
    ProberFailed,
    SourceFailed,
)
from taskhandler_operator.reconcile.local import LocalFolderSyncer
from taskhandler_operator.reconcile.models import (
    STEPS,
    BundleSpec,
    ProbeAccepted,
    ProbeFailed,
    ProbeRequest,
    SyncedRevision,
)
from taskhandler_operator.reconcile.steps import PassPorts, run_pass
from taskhandler_operator.records import BundleOwner, TaskHandlerArtifact

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
OWNER = BundleOwner(cluster_id="c1", namespace="team", name="ts", uid="uid-1")
SPEC = BundleSpec(
    bundle_name="ts", language=Language.TYPESCRIPT, queues=("typescript",), owner=OWNER
)


class FakeClock:
    """Time moves one second per reading, so every duration and stamp is predictable."""

    def __init__(self) -> None:
        self.ticks = 0

    def now(self) -> datetime:
        self.ticks += 1
        return T0 + timedelta(seconds=self.ticks)

    def monotonic(self) -> float:
        self.ticks += 1
        return float(self.ticks)


class FakeProber:
    """Answers from a table: handlers by artifact, or a failure reason."""

    def __init__(self, answers: Mapping[str, dict[str, Any] | str]) -> None:
        self.answers = answers
        self.requests: list[ProbeRequest] = []
        self.running = 0
        self.most_running = 0

    async def __call__(self, request: ProbeRequest) -> ProbeAccepted | ProbeFailed:
        self.requests.append(request)
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        await asyncio.sleep(0.01)  # let the other probes start, if the gate allows
        self.running -= 1
        answer = self.answers[request.candidate.rel_path]
        if isinstance(answer, str):
            return ProbeFailed(request.candidate.rel_path, answer)
        result = TaskHandlerParsingResult.model_validate({"task_handlers": answer})
        return ProbeAccepted(request.candidate.rel_path, result)


class FakeStore:
    """Remembers what was written; the next pass's known artifacts are the last written."""

    def __init__(self, dags: Mapping[str, DagStubs]) -> None:
        self.dags = dags
        self.known: list[TaskHandlerArtifact] = []
        self.written: list[BundlePass] = []
        self.fail_write: Exception | None = None
        self.fail_known: Exception | None = None
        # The dag_ids each stored answer was asked with, as thop_artifact_probe keeps them.
        self.requested: dict[str, tuple[str, ...]] = {}

    async def known_artifacts(self, bundle_name: str) -> list[TaskHandlerArtifact]:
        if self.fail_known is not None:
            raise self.fail_known
        return [a for a in self.known if a.bundle_name == bundle_name]

    async def requested_dag_ids(self, bundle_name: str) -> Mapping[str, tuple[str, ...]]:
        return dict(self.requested)

    async def stub_inventory(self) -> Mapping[str, DagStubs]:
        return self.dags

    async def write(self, bundle_pass: BundlePass) -> PassResult:
        if self.fail_write is not None:
            raise self.fail_write
        self.written.append(bundle_pass)
        self.known = [r.artifact for r in bundle_pass.artifacts]
        for r in bundle_pass.artifacts:
            if r.probed_at is not None:  # a probe row is written for probed answers only
                path = r.artifact.relative_fileloc
                if r.requested_dag_ids is None:
                    self.requested.pop(path, None)
                else:
                    self.requested[path] = r.requested_dag_ids
        bound = sum(len(v.bindings or ()) for v in bundle_pass.verdicts)
        return PassResult(
            bundle_name=bundle_pass.bundle_name,
            bindings_inserted=bound,
            dag_outcomes={
                v.dag_id: "kept" if v.bindings is None else "reconciled"
                for v in bundle_pass.verdicts
            },
            statements=16,
        )


def handler(task_id: str) -> dict[str, Any]:
    return {"task_id": task_id, "binding": "positional", "params": []}


def etl(*task_ids: str) -> dict[str, DagStubs]:
    stubs = tuple(StubTask(task_id=t, queue="typescript", arg_bindings=()) for t in task_ids)
    return {
        "etl": DagStubs(
            dag_id="etl", bundle_name="dags-folder", relative_fileloc="etl.py", stubs=stubs
        )
    }


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    root = tmp_path / "bundle"
    write_typescript_bundle(root / "extract.min.mjs", b"export const extract = 1;\n")
    write_typescript_bundle(root / "load.min.mjs", b"export const load = 2;\n")
    (root / "broken.min.mjs").write_bytes(b"//# airflowBundle={broken\n")
    return root


async def test_the_whole_pass_binds_then_reuses_every_answer(bundle: Path) -> None:
    prober = FakeProber(
        {
            "extract.min.mjs": {"etl": [handler("extract")]},
            "load.min.mjs": {"etl": [handler("load")]},
        }
    )
    store = FakeStore(etl("extract", "load"))
    clock = FakeClock()
    ports = PassPorts(LocalFolderSyncer(bundle), prober, store, clock=clock)

    first = await run_pass(SPEC, ports)

    summary = first.summary
    assert summary.revision.startswith("folder:") and summary.started_at == T0 + timedelta(
        seconds=1
    )
    assert summary.counts.model_dump() == {
        "candidates": 3,
        "cached": 0,
        "probed": 2,
        "rejected": 1,
        "failed": 0,
        "handlers": 2,
        "bindings": 2,
    }
    assert [(i.rel_path, i.kind) for i in summary.artifact_issues] == [
        ("broken.min.mjs", "rejected")
    ]
    assert summary.dag_outcomes == {"etl": "reconciled"} and summary.errors == ()
    # Every step, and the inventory read that says which Dags the probes ask about.
    assert list(summary.step_seconds) == ["sync", "list", "inventory", *STEPS[2:]]
    assert all(seconds > 0 for seconds in summary.step_seconds.values())
    # The write's input: the spec's owner and queues, both fresh answers stamped by the clock.
    [written] = store.written
    assert (written.owner, written.queues) == (OWNER, ("typescript",))
    assert [(r.artifact.relative_fileloc, r.revision) for r in written.artifacts] == [
        ("extract.min.mjs", summary.revision),
        ("load.min.mjs", summary.revision),
    ]
    assert all(r.probed_at is not None and r.probed_at > T0 for r in written.artifacts)
    assert {b.task_id for b in first.validated.result.bindings} == {"extract", "load"}

    # Nothing changed: every answer is reused, nothing is probed.
    prober.requests.clear()
    second = await run_pass(SPEC, ports)
    assert prober.requests == []
    assert (second.summary.counts.cached, second.summary.counts.probed) == (2, 0)
    assert all(r.probed_at is None for r in store.written[-1].artifacts)


async def test_an_artifact_without_an_answer_is_named_in_the_problem(bundle: Path) -> None:
    prober = FakeProber(
        {"extract.min.mjs": {"etl": [handler("extract")]}, "load.min.mjs": "the runtime crashed"}
    )
    store = FakeStore(etl("extract", "load"))
    outcome = await run_pass(SPEC, PassPorts(LocalFolderSyncer(bundle), prober, store))

    summary = outcome.summary
    assert (summary.counts.probed, summary.counts.failed) == (1, 1)
    assert ("load.min.mjs", "probe_failed", "the runtime crashed") in [
        (i.rel_path, i.kind, i.reason) for i in summary.artifact_issues
    ]
    [error] = summary.errors
    assert error.message.startswith(
        "Dag 'etl', task 'load': no artifact in Dag bundle 'ts' registers it; no answer from "
        "'broken.min.mjs' ("
    )
    assert error.message.endswith("'load.min.mjs' (the runtime crashed)")
    # The Dag keeps its rows: no bindings are handed to the write.
    assert summary.dag_outcomes == {"etl": "kept"}
    assert store.written[0].verdicts[0].bindings is None


async def test_a_pass_validates_only_the_dags_of_its_queues(bundle: Path) -> None:
    """The Dags on other queues get no verdict (a thousand of them cost a thousand verdicts a
    pass); the writer is told the inventory's Dags to remove the bundle's rows of them, and a
    Dag whose stub's queue is unreadable concerns every bundle."""
    prober = FakeProber(
        {"extract.min.mjs": {"etl": [handler("extract")]}, "load.min.mjs": {"etl": []}}
    )
    dags = {
        **etl("extract"),
        **{
            f"java{i}": DagStubs(
                dag_id=f"java{i}",
                bundle_name="dags-folder",
                relative_fileloc=f"java{i}.py",
                stubs=(StubTask(task_id="t", queue="java", arg_bindings=()),),
            )
            for i in range(3)
        },
        "odd": DagStubs(
            dag_id="odd",
            bundle_name="dags-folder",
            relative_fileloc="odd.py",
            problems=(DagReadProblem(message="no queue", task_id="t"),),
        ),
    }
    store = FakeStore(dags)

    outcome = await run_pass(SPEC, PassPorts(LocalFolderSyncer(bundle), prober, store))

    [written] = store.written
    assert [v.dag_id for v in written.verdicts] == ["etl", "odd"]
    assert written.inventory_dags is not None and set(written.inventory_dags) == set(dags)
    assert outcome.summary.dag_outcomes == {"etl": "reconciled", "odd": "kept"}
    assert [e.dag_id for e in outcome.summary.errors] == ["odd"]


async def test_probes_run_in_parallel_up_to_the_limit(tmp_path: Path) -> None:
    for n in range(6):
        write_typescript_bundle(tmp_path / f"a{n}.min.mjs", f"export const a = {n};\n".encode())
    prober = FakeProber({f"a{n}.min.mjs": {} for n in range(6)})
    ports = PassPorts(LocalFolderSyncer(tmp_path), prober, FakeStore({}), probe_parallelism=2)
    outcome = await run_pass(SPEC, ports)
    assert outcome.summary.counts.probed == 6
    assert prober.most_running == 2


class BrokenSyncer:
    async def __call__(self, spec: BundleSpec) -> SyncedRevision:
        raise ConnectionError("git fetch: could not resolve host example.invalid")


class RaisingProber:
    async def __call__(self, request: ProbeRequest) -> ProbeAccepted | ProbeFailed:
        raise RuntimeError("cannot create probe Job: forbidden")


async def test_each_failure_names_its_step_and_whether_to_retry(bundle: Path) -> None:
    ok_prober = FakeProber({"extract.min.mjs": {}, "load.min.mjs": {}})

    with pytest.raises(SourceFailed) as source:
        await run_pass(SPEC, PassPorts(BrokenSyncer(), ok_prober, FakeStore({})))
    assert (source.value.step, source.value.reason, source.value.retryable) == (
        "sync",
        "SourceUnavailable",
        True,
    )
    assert str(source.value) == "sync: git fetch: could not resolve host example.invalid"

    store = FakeStore({})
    store.fail_known = DatabaseUnavailable("database unavailable: connection refused")
    with pytest.raises(DatabaseFailed) as database:
        await run_pass(SPEC, PassPorts(LocalFolderSyncer(bundle), ok_prober, store))
    assert (database.value.step, database.value.reason, database.value.retryable) == (
        "plan",
        "DatabaseUnavailable",
        True,
    )

    with pytest.raises(ProberFailed) as prober:
        await run_pass(SPEC, PassPorts(LocalFolderSyncer(bundle), RaisingProber(), FakeStore({})))
    assert (prober.value.step, prober.value.component) == ("probe", "prober")

    store = FakeStore({})
    other = OWNER.model_copy(update={"namespace": "elsewhere"})
    store.fail_write = BundleClaimed("ts", other, T0)
    with pytest.raises(OwnershipConflict) as owned:
        await run_pass(SPEC, PassPorts(LocalFolderSyncer(bundle), ok_prober, store))
    assert (owned.value.step, owned.value.reason, owned.value.retryable) == (
        "write",
        "BundleClaimed",
        False,
    )
    assert owned.value.owner == other
    assert "TaskHandlerBundle elsewhere/ts in cluster 'c1'" in str(owned.value)


# --- dag_ids: what a probe asks about, and when a reused answer is asked again --------------


class FilteringProber(FakeProber):
    """A runtime that answers only the Dags the request names (ADR-0013 Design A), and fails
    without any answer when the request names none (a released TypeScript runtime does)."""

    async def __call__(self, request: ProbeRequest) -> ProbeAccepted | ProbeFailed:
        self.requests.append(request)
        answer = self.answers[request.candidate.rel_path]
        assert not isinstance(answer, str)
        if not request.dag_ids:
            return ProbeFailed(request.candidate.rel_path, "exited_without_result")
        filtered = {d: h for d, h in answer.items() if d in request.dag_ids}
        result = TaskHandlerParsingResult.model_validate({"task_handlers": filtered})
        return ProbeAccepted(request.candidate.rel_path, result)


def stubs_of(*dag_ids: str, queue: str = "typescript") -> dict[str, DagStubs]:
    return {
        dag_id: DagStubs(
            dag_id=dag_id,
            bundle_name="dags-folder",
            relative_fileloc=f"{dag_id}.py",
            stubs=(StubTask(task_id="extract", queue=queue, arg_bindings=()),),
        )
        for dag_id in dag_ids
    }


async def test_probes_ask_about_the_stub_dags_and_a_new_dag_reprobes_once(
    tmp_path: Path,
) -> None:
    root = tmp_path / "bundle"
    write_typescript_bundle(root / "extract.min.mjs", b"export const extract = 1;\n")
    answers = {"extract.min.mjs": {d: [handler("extract")] for d in ("etl", "new", "other")}}
    prober = FilteringProber(answers)
    # A Dag on another queue is none of this bundle's business: never asked about.
    store = FakeStore({**stubs_of("etl"), **stubs_of("elsewhere", queue="java")})
    ports = PassPorts(LocalFolderSyncer(root), prober, store, clock=FakeClock())

    first = await run_pass(SPEC, ports)
    assert [r.dag_ids for r in prober.requests] == [("etl",)]
    assert {b.dag_id for b in first.validated.result.bindings} == {"etl"}
    assert [r.requested_dag_ids for r in store.written[-1].artifacts] == [("etl",)]

    # Nothing new: the answer covers every stub Dag, so it is reused.
    prober.requests.clear()
    await run_pass(SPEC, ports)
    assert prober.requests == []

    # A stub Dag the answer was not asked about: asked again, once, with both.
    store.dags = {**store.dags, **stubs_of("new")}
    third = await run_pass(SPEC, ports)
    assert [r.dag_ids for r in prober.requests] == [("etl", "new")]
    assert {b.dag_id for b in third.validated.result.bindings} == {"etl", "new"}
    prober.requests.clear()
    await run_pass(SPEC, ports)
    assert prober.requests == []

    # A Dag leaving the queues asks nothing again: the answer still covers what is left.
    store.dags = stubs_of("new")
    await run_pass(SPEC, ports)
    assert prober.requests == []


async def test_an_answer_naming_a_dag_it_was_not_asked_about_is_never_reprobed(
    tmp_path: Path,
) -> None:
    root = tmp_path / "bundle"
    write_typescript_bundle(root / "extract.min.mjs", b"export const extract = 1;\n")
    # A runtime of the current protocol ignores dag_ids: it answers every Dag it has.
    prober = FakeProber({"extract.min.mjs": {"etl": [handler("extract")], "x": []}})
    store = FakeStore(stubs_of("etl"))
    ports = PassPorts(LocalFolderSyncer(root), prober, store, clock=FakeClock())
    await run_pass(SPEC, ports)
    prober.requests.clear()
    store.dags = {**store.dags, **stubs_of("new")}
    await run_pass(SPEC, ports)
    assert prober.requests == []


class RefusingClaims:
    """A claim check that finds the bundle name held elsewhere."""

    def __init__(self, holder: BundleOwner) -> None:
        self.holder = holder
        self.asked: list[BundleSpec] = []

    async def __call__(self, spec: BundleSpec) -> None:
        self.asked.append(spec)
        raise BundleClaimed(spec.bundle_name, self.holder, T0)


async def test_a_later_claimant_stops_before_probing_anything(bundle: Path) -> None:
    prober = FakeProber({"extract.min.mjs": {}, "load.min.mjs": {}})
    store = FakeStore(etl("extract"))
    holder = OWNER.model_copy(update={"namespace": "elsewhere", "uid": "uid-0"})
    claims = RefusingClaims(holder)
    ports = PassPorts(LocalFolderSyncer(bundle), prober, store, claims=claims)
    with pytest.raises(OwnershipConflict) as owned:
        await run_pass(SPEC, ports)
    assert (owned.value.step, owned.value.reason, owned.value.owner) == (
        "plan",
        "BundleClaimed",
        holder,
    )
    assert "taskhandler-operator db claims release ts --uid uid-0" in str(owned.value)
    assert claims.asked == [SPEC]
    assert prober.requests == [] and store.written == []


class HangingProber:
    """A probe that never ends (a Job nobody runs, a hung API call)."""

    async def __call__(self, request: ProbeRequest) -> ProbeAccepted | ProbeFailed:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


class HangingStore(FakeStore):
    """A database that accepts and never answers."""

    async def write(self, bundle_pass: BundlePass) -> PassResult:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_pass_past_its_deadline_is_abandoned_in_the_step_it_is_in(bundle: Path) -> None:
    with pytest.raises(PassTimedOut) as probing:
        await run_pass(
            SPEC, PassPorts(LocalFolderSyncer(bundle), HangingProber(), FakeStore({}), timeout=0.2)
        )
    assert (probing.value.step, probing.value.reason, probing.value.retryable) == (
        "probe",
        "PassTimedOut",
        True,
    )
    assert "did not finish within 0.2s" in str(probing.value)

    ok_prober = FakeProber({"extract.min.mjs": {}, "load.min.mjs": {}})
    with pytest.raises(PassTimedOut) as writing:
        await run_pass(
            SPEC, PassPorts(LocalFolderSyncer(bundle), ok_prober, HangingStore({}), timeout=0.5)
        )
    assert writing.value.step == "write"


async def test_a_timeout_raised_inside_a_step_is_not_the_pass_deadline(bundle: Path) -> None:
    store = FakeStore({})
    store.fail_known = TimeoutError("the step's own timeout")
    with pytest.raises(PassError) as failed:
        ports = PassPorts(LocalFolderSyncer(bundle), FakeProber({}), store, timeout=60)
        await run_pass(SPEC, ports)
    assert not isinstance(failed.value, PassTimedOut)
    assert failed.value.step == "plan"


async def test_a_fenced_write_is_a_deposed_leader_never_retried(bundle: Path) -> None:
    store = FakeStore({})
    store.fail_write = FencedOut(None, None, "write of bundle 'ts'")
    ok_prober = FakeProber({"extract.min.mjs": {}, "load.min.mjs": {}})
    with pytest.raises(Deposed) as deposed:
        await run_pass(SPEC, PassPorts(LocalFolderSyncer(bundle), ok_prober, store))
    assert (deposed.value.step, deposed.value.reason, deposed.value.retryable) == (
        "write",
        "LeaderDeposed",
        False,
    )

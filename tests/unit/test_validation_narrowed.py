"""Validating only a bundle's own Dags decides exactly what validating every Dag did.

A whole pass used to give every Dag of Airflow's inventory a verdict (``bindings=()`` for the
Dags without a stub on the bundle's queues, which told the writer to remove the bundle's rows of
them). Now it validates the Dags the inventory's queue index says concern its queues, and the
writer reconciles to no binding the other Dags of the inventory the bundle has rows of
(``BundlePass.inventory_dags``). Over generated inventories, artifacts and stored rows, the two
must agree on everything the pass writes or reports: the rows it removes, keeps and wants, the
proposed publication, the problems (in order), the bindings and the outcomes of the Dags the
bundle has anything to do with. The same on PostgreSQL is
``tests/integration/db/test_writer.py::test_a_narrowed_pass_removes_the_rows_of_a_dag_without_a_verdict``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskhandler_operator.airflow.serialized import DagReadProblem, DagStubs, StubTask
from taskhandler_operator.airflow.snapshot import InventorySnapshot
from taskhandler_operator.db.write_models import BundlePass
from taskhandler_operator.db.write_statements import prepare_params
from taskhandler_operator.publication.changes import (
    BindingRow,
    ChangeSet,
    compute_change,
    proposed_rows,
)
from taskhandler_operator.records import (
    ArtifactRecord,
    BundleOwner,
    BundleProblem,
    TaskHandlerArtifact,
    TaskHandlerDeclaration,
    TaskHandlerParam,
)
from taskhandler_operator.validation import BrokenCandidate, ValidationResult, validate_bundle

BUNDLE = "handlers"
OWNER = BundleOwner(cluster_id="c", namespace="ns", name=BUNDLE, uid="u-1")
QUEUES = ("java", "go", "default", "other")
TASKS = ("extract", "load", "report")
DAG_IDS = tuple(f"dag{i}" for i in range(8))
PATHS = ("a.jar", "b.jar", "c.jar")

queue = st.sampled_from(QUEUES)
stubs = st.lists(
    st.builds(
        StubTask,
        task_id=st.sampled_from(TASKS),
        queue=queue,
        arg_bindings=st.just(()),
        mapped=st.booleans(),
    ),
    max_size=3,
    unique_by=lambda s: s.task_id,
)
read_problems = st.lists(
    st.builds(
        DagReadProblem,
        message=st.just("unreadable task"),
        task_id=st.none() | st.sampled_from(TASKS),
        queue=st.none() | queue,
    ),
    max_size=2,
)


@st.composite
def inventories(draw: st.DrawFn) -> dict[str, DagStubs]:
    dag_ids = draw(st.lists(st.sampled_from(DAG_IDS), unique=True, max_size=len(DAG_IDS)))
    return {
        dag_id: DagStubs(
            dag_id=dag_id,
            bundle_name="dags-folder",
            relative_fileloc=f"{dag_id}.py",
            stubs=tuple(draw(stubs)),
            # Mostly readable Dags: a problem of unknown queue concerns every bundle.
            problems=tuple(draw(read_problems)) if draw(st.integers(0, 3)) == 0 else (),
        )
        for dag_id in dag_ids
    }


# None: presence only; [] takes no argument; one parameter: a stub without arguments misses it
# (an error when positional, a warning when named).
params = st.sampled_from([None, [], [TaskHandlerParam(name="n", value_schema={"type": "integer"})]])
declarations = st.builds(
    TaskHandlerDeclaration,
    task_id=st.sampled_from(TASKS),
    binding=st.sampled_from(["positional", "named"]),
    params=params,
)


@st.composite
def answers(draw: st.DrawFn) -> list[TaskHandlerArtifact]:
    paths = draw(st.lists(st.sampled_from(PATHS), unique=True, max_size=len(PATHS)))
    return [
        TaskHandlerArtifact(
            bundle_name=BUNDLE,
            relative_fileloc=path,
            size_bytes=1,
            cache_digest=f"d-{path}",
            task_handlers=draw(
                st.dictionaries(
                    st.sampled_from(DAG_IDS),
                    st.lists(declarations, max_size=2, unique_by=lambda d: d.task_id),
                    max_size=4,
                )
            ),
        )
        for path in paths
    ]


@dataclass(frozen=True)
class Decided:
    """Everything of a pass that reaches the database or the bundle's status."""

    result: ValidationResult = field(compare=False)  # its verdicts differ, by design
    bindings: Mapping[str, list[object]]
    wanted: list[BindingRow]
    problems: list[BundleProblem]
    removed_from: frozenset[str]  # the Dags whose rows of this bundle the pass reconciles
    proposed: list[BindingRow]
    change: ChangeSet
    outcomes: Mapping[str, str]


def decide(
    bundle_pass: BundlePass, result: ValidationResult, published: Sequence[BindingRow]
) -> Decided:
    """What the writer does with a pass, without the database (its pure steps, in order)."""
    params = prepare_params(bundle_pass)
    unjudged = bundle_pass.unjudged(r.dag_id for r in published)
    reconciled = [*params.reconciled_dag_ids, *unjudged]
    proposed = proposed_rows(published, reconciled, params.wanted)
    outcomes = {
        v.dag_id: "kept" if v.bindings is None else "reconciled" for v in bundle_pass.verdicts
    }
    outcomes.update((dag_id, "reconciled") for dag_id in unjudged)
    held = {r.dag_id for r in published}
    concerned = {v.dag_id for v in result.verdicts if v.bindings or v.errors or v.warnings}
    return Decided(
        result=result,
        bindings=params.bindings,
        wanted=params.wanted,
        problems=params.problems,
        removed_from=frozenset(reconciled) & held,
        proposed=proposed,
        change=compute_change(published, proposed),
        outcomes={d: o for d, o in outcomes.items() if d in held | concerned},
    )


def full_pass(
    dags: Mapping[str, DagStubs],
    queues: Sequence[str],
    artifacts: list[TaskHandlerArtifact],
    broken: list[BrokenCandidate],
    published: Sequence[BindingRow],
) -> Decided:
    """Before: every Dag of the inventory validated and handed to the writer."""
    result = validate_bundle(
        bundle_name=BUNDLE, queues=queues, dags=dags.values(), artifacts=artifacts, broken=broken
    )
    return decide(_pass(artifacts, queues, result, None), result, published)


def narrowed_pass(
    dags: Mapping[str, DagStubs],
    queues: Sequence[str],
    artifacts: list[TaskHandlerArtifact],
    broken: list[BrokenCandidate],
    published: Sequence[BindingRow],
) -> Decided:
    """Now: the Dags the queue index names, and the inventory's ids for the writer."""
    snapshot = InventorySnapshot(dags)
    result = validate_bundle(
        bundle_name=BUNDLE,
        queues=queues,
        dags=snapshot.concerning(queues),
        artifacts=artifacts,
        broken=broken,
    )
    return decide(_pass(artifacts, queues, result, snapshot.keys()), result, published)


def _pass(
    artifacts: list[TaskHandlerArtifact],
    queues: Sequence[str],
    result: ValidationResult,
    inventory: object,
) -> BundlePass:
    return BundlePass(
        bundle_name=BUNDLE,
        owner=OWNER,
        queues=tuple(queues),
        artifacts=tuple(ArtifactRecord(artifact=a) for a in artifacts),
        verdicts=result.verdicts,
        inventory_dags=inventory,
    )


@st.composite
def published_rows(draw: st.DrawFn) -> list[BindingRow]:
    """The bundle's stored rows: of Dags in the inventory or not (gone from Airflow)."""
    keys = draw(
        st.lists(
            st.tuples(st.sampled_from(DAG_IDS), st.sampled_from(TASKS)), unique=True, max_size=6
        )
    )
    return sorted(
        (
            BindingRow(
                dag_id=dag_id,
                task_id=task_id,
                artifact_path=draw(st.sampled_from(PATHS)),
                dag_bundle_name="dags-folder",
                dag_fileloc=f"{dag_id}.py",
            )
            for dag_id, task_id in keys
        ),
        key=lambda r: r.key,
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dags=inventories(),
    queues=st.lists(queue, min_size=1, max_size=2, unique=True),
    artifacts=answers(),
    broken=st.lists(
        st.builds(BrokenCandidate, rel_path=st.just("z.jar"), reason=st.just("timed out")),
        max_size=1,
    ),
    published=published_rows(),
)
def test_the_narrowed_pass_decides_what_the_full_pass_did(
    dags: dict[str, DagStubs],
    queues: list[str],
    artifacts: list[TaskHandlerArtifact],
    broken: list[BrokenCandidate],
    published: list[BindingRow],
) -> None:
    before = full_pass(dags, queues, artifacts, broken, published)
    after = narrowed_pass(dags, queues, artifacts, broken, published)

    assert after.result.problems == before.result.problems
    assert after.result.bindings == before.result.bindings
    assert after.result.artifact_problems == before.result.artifact_problems
    assert after.bindings == before.bindings
    assert after.wanted == before.wanted
    assert after.problems == before.problems
    assert after.removed_from == before.removed_from
    assert after.proposed == before.proposed
    assert after.change == before.change
    assert after.outcomes == before.outcomes
    # The full pass's other verdicts were all "no binding, no problem".
    judged = {v.dag_id for v in after.result.verdicts}
    for verdict in before.result.verdicts:
        if verdict.dag_id not in judged:
            assert (verdict.bindings, verdict.errors, verdict.warnings) == ((), (), ())


def test_rows_of_a_dag_that_moved_queue_go_and_rows_of_a_dag_airflow_lost_stay() -> None:
    """The two cases the generated ones must cover, spelled out."""
    moved = DagStubs(
        dag_id="dag0",
        bundle_name="dags-folder",
        relative_fileloc="dag0.py",
        stubs=(StubTask(task_id="extract", queue="go", arg_bindings=()),),
    )
    rows = [
        BindingRow(dag_id=d, task_id="extract", artifact_path="a.jar", dag_fileloc=f"{d}.py")
        for d in ("dag0", "dag1")  # dag1 is not in the inventory (stale, or deleted)
    ]
    artifacts = [
        TaskHandlerArtifact(
            bundle_name=BUNDLE,
            relative_fileloc="a.jar",
            size_bytes=1,
            task_handlers={"dag0": [TaskHandlerDeclaration(task_id="extract", params=None)]},
        )
    ]
    after = narrowed_pass({"dag0": moved}, ["java"], artifacts, [], rows)

    assert after.result.verdicts == ()  # nothing of the bundle's queues to validate
    assert after.removed_from == {"dag0"}
    assert [r.dag_id for r in after.proposed] == ["dag1"]
    assert after.outcomes == {"dag0": "reconciled"}
    assert after == full_pass({"dag0": moved}, ["java"], artifacts, [], rows)


@given(dags=inventories(), queues=st.lists(queue, max_size=3, unique=True))
def test_the_queue_index_names_what_a_scan_of_every_dag_finds(
    dags: dict[str, DagStubs], queues: list[str]
) -> None:
    snapshot = InventorySnapshot(dags)
    wanted = set(queues)
    with_stubs = sorted(d for d, s in dags.items() if any(t.queue in wanted for t in s.stubs))
    concerning = sorted(
        d
        for d, s in dags.items()
        if any(t.queue in wanted for t in s.stubs)
        or any(p.queue is None or p.queue in wanted for p in s.problems)
    )
    assert list(snapshot.with_stubs_on(queues)) == with_stubs
    assert [d.dag_id for d in snapshot.concerning(queues)] == concerning
    assert dict(snapshot) == dags and len(snapshot) == len(dags)
    assert InventorySnapshot.of(snapshot) is snapshot

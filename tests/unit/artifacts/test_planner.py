"""The fast path (reference airflow-langsdk.md §8.3)."""

from __future__ import annotations

import pytest

from taskhandler_operator.artifacts.models import Candidate
from taskhandler_operator.artifacts.planner import (
    KnownArtifact,
    ProbePlan,
    answer_covers,
    plan_probes,
    recheck_coverage,
    request_dag_ids,
)
from taskhandler_operator.limits import MAX_REQUEST_DAG_ID_BYTES, MAX_REQUEST_DAG_IDS

HANDLERS = {"etl_dag": [{"task_id": "extract", "binding": "positional", "params": []}]}


def _known(
    rel: str, size: int = 100, digest: str | None = "d1", bundle: str = "B"
) -> KnownArtifact:
    return KnownArtifact(bundle, rel, size, digest, HANDLERS)


def test_same_path_size_and_digest_reuses_the_record() -> None:
    candidate = Candidate("etl", 100, "d1")
    record = _known("etl")
    plan = plan_probes([candidate], [record], "B")
    assert plan.cached == [(candidate, record)]
    assert plan.cached[0][1].task_handlers == HANDLERS
    assert plan.probe == [] and plan.rejected == []


def test_errored_candidate_is_rejected_even_when_a_record_matches() -> None:
    candidate = Candidate("etl", 100, "d1", error="etl is not executable. ...")
    plan = plan_probes([candidate], [_known("etl")], "B")
    assert plan.rejected == [candidate]
    assert plan.cached == [] and plan.probe == []


def test_no_stored_digest_is_always_probed() -> None:
    candidate = Candidate("etl", 100, None)
    plan = plan_probes([candidate], [_known("etl", digest=None)], "B")
    assert plan.probe == [candidate]
    assert plan.cached == []


def test_changed_digest_size_or_path_is_probed() -> None:
    candidates = [
        Candidate("etl", 100, "d2"),  # new digest
        Candidate("load", 101, "d1"),  # new size
        Candidate("new", 100, "d1"),  # no record at this path
    ]
    known = [_known("etl"), _known("load")]
    plan = plan_probes(candidates, known, "B")
    assert plan.probe == candidates
    assert plan.cached == []


def test_records_of_other_bundles_are_ignored() -> None:
    candidate = Candidate("etl", 100, "d1")
    plan = plan_probes([candidate], [_known("etl", bundle="other")], "B")
    assert plan.probe == [candidate]


def test_listing_order_is_kept_in_every_list() -> None:
    candidates = [
        Candidate("c", 1, "x", error="broken"),
        Candidate("b", 100, "d1"),
        Candidate("a", 5, None),
        Candidate("d", 100, "d1"),
        Candidate("e", 9, None),
        Candidate("f", 1, None, error="also broken"),
    ]
    plan = plan_probes(candidates, [_known("d"), _known("b")], "B")
    assert [c.rel_path for c, _ in plan.cached] == ["b", "d"]
    assert [c.rel_path for c in plan.probe] == ["a", "e"]
    assert [c.rel_path for c in plan.rejected] == ["c", "f"]


def test_first_record_wins_for_a_repeated_path() -> None:
    candidate = Candidate("etl", 100, "d1")
    first, second = _known("etl"), KnownArtifact("B", "etl", 100, "d1", {})
    plan = plan_probes([candidate], [first, second], "B")
    assert plan.cached[0][1] is first


def test_pydantic_records_are_accepted() -> None:
    from taskhandler_operator.records import TaskHandlerArtifact

    record = TaskHandlerArtifact(
        bundle_name="B", relative_fileloc="etl", size_bytes=100, cache_digest="d1", task_handlers={}
    )
    plan = plan_probes([Candidate("etl", 100, "d1")], [record], "B")
    assert plan.cached[0][1] is record


# -- reusing an answer when new Dags appear (dag_ids) ----------------------------------------


@pytest.mark.parametrize(
    ("requested", "answered", "wanted", "covers"),
    [
        # Nothing requested: the answer is the runtime's whole answer.
        (None, [], ["new"], True),
        (None, ["a"], ["a", "new"], True),
        # It declares a Dag nobody asked for: this runtime ignores dag_ids.
        (["a"], ["a", "b"], ["a", "new"], True),
        # Possibly filtered: it speaks only for what was requested.
        (["a", "b"], ["a"], ["a", "b"], True),
        (["a", "b"], ["a"], ["b"], True),
        (["a"], ["a"], ["a", "new"], False),
        (["a"], [], ["new"], False),
        ([], [], ["new"], False),
        ([], [], [], True),
    ],
)
def test_answer_covers(
    requested: list[str] | None, answered: list[str], wanted: list[str], covers: bool
) -> None:
    assert answer_covers(requested, answered, wanted) is covers


# --- dag_ids ----------------------------------------------------------------------------------


def test_recheck_moves_only_answers_that_may_have_been_filtered() -> None:
    a, b, c, d = (Candidate(p, 1, "x") for p in ("a", "b", "c", "d"))
    plan: ProbePlan[KnownArtifact] = ProbePlan(
        cached=[(a, _known("a")), (b, _known("b")), (c, _known("c"))], probe=[d], rejected=[]
    )
    requested = {"a": ("etl",), "b": ("etl",)}  # c: asked nothing (Airflow's own row)
    answered = {"a": ("etl",), "b": ("etl", "other"), "c": ("etl",)}
    checked = recheck_coverage(plan, requested, {"etl", "new"}, answered)
    # a may have been filtered and was not asked about "new"; b answered a Dag it was not
    # asked about (its runtime ignores dag_ids); c was asked nothing.
    assert [cand.rel_path for cand, _ in checked.cached] == ["b", "c"]
    assert [cand.rel_path for cand in checked.probe] == ["a", "d"]
    assert recheck_coverage(plan, requested, {"etl"}, answered) is plan


def test_request_dag_ids_are_sorted_and_bounded() -> None:
    assert request_dag_ids(["b", "a", "b"]) == (("a", "b"), None)
    assert request_dag_ids([]) == ((), None)
    too_many = [f"dag_{i}" for i in range(MAX_REQUEST_DAG_IDS + 1)]
    ids, reason = request_dag_ids(too_many)
    assert ids is None and reason is not None
    assert reason.startswith(f"the bundle's queues have stub tasks in {len(too_many)} Dags")
    too_long = ["x" * 250 + str(i) for i in range(MAX_REQUEST_DAG_ID_BYTES // 250 + 1)]
    assert request_dag_ids(too_long)[0] is None

"""The pure publication logic: change sets and the publish policy."""

from __future__ import annotations

from typing import Any

from taskhandler_operator.publication.changes import (
    BindingRow,
    ChangeSet,
    compute_change,
    declared,
    proposed_rows,
    same_placement,
)
from taskhandler_operator.publication.policy import PublishPolicy, hold_reason
from taskhandler_operator.records import TaskHandlerDeclaration, TaskHandlerParam


def row(task: str, path: str = "a.jar", dag: str = "etl", **fields: Any) -> BindingRow:
    defaults: dict[str, Any] = {
        "artifact_digest": f"d-{path}",
        "binding": "positional",
        "params": None,
        "dag_bundle_name": "dags",
        "dag_fileloc": f"{dag}.py",
    }
    return BindingRow(dag_id=dag, task_id=task, artifact_path=path, **{**defaults, **fields})


def test_each_kind_of_change_is_found_and_ordered_removals_first() -> None:
    published = [row("keep"), row("gone"), row("move"), row("param"), row("content")]
    proposed = [
        row("keep"),
        row("move", "b.jar"),
        row("param", params=[{"name": "x", "value_schema": None, "exact_name": False}]),
        row("content", artifact_digest="new"),
        row("new"),
    ]
    change = compute_change(published, proposed)
    assert [(c.kind, c.task_id) for c in change.changes] == [
        ("removed", "gone"),
        ("moved", "move"),
        ("changed", "content"),
        ("changed", "param"),
        ("added", "new"),
    ]
    counts = change.counts()
    assert (counts.added, counts.removed, counts.moved, counts.changed, counts.total) == (
        1,
        1,
        1,
        2,
        5,
    )
    assert counts.describe() == "1 removed, 1 moved, 2 changed, 1 added"
    assert change.lines()[1] == "moved etl/move: a.jar @d-a.jar -> b.jar @d-b.jar"
    assert change.lines()[2].endswith("(content)")
    assert change.lines()[3].endswith("(parameters)")
    assert not compute_change(published, published)


def test_a_change_set_round_trips_through_json_and_its_summary_is_bounded() -> None:
    change = compute_change([], [row(f"t{i}") for i in range(8)])
    again = ChangeSet.from_json(change.to_json())
    assert again == change
    summary = change.summary(3)
    assert summary.counts.added == 8 and len(summary.first) == 3 and summary.omitted == 5
    assert summary.describe().endswith("; and 5 more")
    assert ChangeSet.from_json({}) == ChangeSet()


def test_the_proposal_keeps_the_rows_of_dags_left_alone_and_skips_conflicts() -> None:
    published = [row("a", dag="kept"), row("b", dag="redone"), row("c", dag="redone")]
    wanted = [row("b", "b.jar", dag="redone"), row("d", dag="redone"), row("x", dag="other")]
    proposed = proposed_rows(published, ["redone"], wanted, held_elsewhere=[("redone", "d")])
    assert [(r.dag_id, r.task_id, r.artifact_path) for r in proposed] == [
        ("kept", "a", "a.jar"),
        ("redone", "b", "b.jar"),
    ]


def test_a_declaration_reads_the_same_from_an_answer_and_from_a_stored_row() -> None:
    decl = TaskHandlerDeclaration(
        task_id="t", binding="named_open", params=[TaskHandlerParam(name="x", required=True)]
    )
    from_answer = declared({"etl": [decl]}, "etl", "t")
    stored = {"task_id": "t", "binding": "named", "params": [{"name": "x", "exact_name": False}]}
    assert from_answer == declared({"etl": [stored]}, "etl", "t")
    assert from_answer == ("named", [{"name": "x", "value_schema": None, "exact_name": False}])
    assert declared({"etl": [decl]}, "etl", "other") == (None, None)


def test_placement_ignores_what_the_artifact_declares_now() -> None:
    assert same_placement([row("t")], [row("t", artifact_digest="x", binding=None)])
    assert not same_placement([row("t")], [row("t", "b.jar")])


def test_the_policies_hold_what_they_say() -> None:
    removal = compute_change([row("t")], [])
    move = compute_change([row("t")], [row("t", "b.jar")])
    added = compute_change([], [row("t")])
    failed: set[str] = set()
    assert hold_reason(PublishPolicy.AUTOMATIC, removal, failed) is None
    reason = hold_reason(PublishPolicy.NO_REMOVAL, removal, failed)
    assert reason is not None and "etl/t" in reason
    assert hold_reason(PublishPolicy.NO_REMOVAL, move, failed) is None
    assert hold_reason(PublishPolicy.NO_REMOVAL, added, failed) is None
    broken = hold_reason(PublishPolicy.NO_REMOVAL, move, {"b.jar"})
    assert broken is not None and "b.jar" in broken
    assert hold_reason(PublishPolicy.MANUAL, added, failed) is not None
    assert hold_reason(PublishPolicy.MANUAL, ChangeSet(), failed) is None

"""Validation of stub tasks against declared task handlers: every rule, with its text."""

from __future__ import annotations

from typing import Any

import pytest

from taskhandler_devenv.serialized_dags import literal_arg, xcom_arg
from taskhandler_operator.airflow.arg_bindings import parse_arg_bindings
from taskhandler_operator.airflow.serialized import DagReadProblem, DagStubs, StubTask
from taskhandler_operator.records import (
    TaskHandlerArtifact,
    TaskHandlerDeclaration,
    TaskHandlerParam,
)
from taskhandler_operator.validation import (
    BrokenCandidate,
    DagVerdict,
    compare_value_schemas,
    fold_name,
    schema_types,
    validate_bundle,
)

BUNDLE = "java-task-handlers"
QUEUES = ("java",)
INT = {"type": "integer", "format": "int64"}
NUM = {"type": "number", "format": "double"}
STR = {"type": "string"}
OPT_INT = {"anyOf": [INT, {"type": "null"}]}
OBJ = {"type": "object", "additionalProperties": True}


def stub(
    task_id: str,
    args: list[dict[str, Any]] | None = None,
    *,
    queue: str = "java",
    mapped: bool = False,
) -> StubTask:
    parsed = parse_arg_bindings(args)
    assert not parsed.problems
    return StubTask(task_id=task_id, queue=queue, arg_bindings=parsed.bindings, mapped=mapped)


def dag(
    *stubs: StubTask, dag_id: str = "etl", problems: tuple[DagReadProblem, ...] = ()
) -> DagStubs:
    return DagStubs(
        dag_id=dag_id,
        bundle_name="dags-folder",
        relative_fileloc=f"{dag_id}.py",
        stubs=stubs,
        problems=problems,
    )


def param(
    name: str | None = None, schema: dict[str, Any] | None = None, *, exact: bool = False
) -> dict[str, Any]:
    return {"name": name, "value_schema": schema, "exact_name": exact}


def handler(
    task_id: str, params: list[dict[str, Any]] | None, binding: str = "positional"
) -> TaskHandlerDeclaration:
    return TaskHandlerDeclaration(
        task_id=task_id,
        binding=binding,
        params=None if params is None else [TaskHandlerParam(**p) for p in params],
    )


def artifact(
    path: str, *declarations: TaskHandlerDeclaration, dag_id: str = "etl"
) -> TaskHandlerArtifact:
    return TaskHandlerArtifact(
        bundle_name=BUNDLE,
        relative_fileloc=path,
        size_bytes=10,
        cache_digest="d",
        task_handlers={dag_id: list(declarations)},
    )


def verdict_of(
    dag_stubs: DagStubs,
    *artifacts: TaskHandlerArtifact,
    broken: tuple[BrokenCandidate, ...] = (),
) -> DagVerdict:
    result = validate_bundle(
        bundle_name=BUNDLE, queues=QUEUES, dags=[dag_stubs], artifacts=artifacts, broken=broken
    )
    (verdict,) = result.verdicts
    return verdict


def error_texts(verdict: DagVerdict) -> list[str]:
    return [p.message for p in verdict.errors]


def warning_texts(verdict: DagVerdict) -> list[str]:
    return [p.message for p in verdict.warnings]


# --- claims ------------------------------------------------------------------------------------


def test_exactly_one_claim_binds() -> None:
    v = verdict_of(dag(stub("extract")), artifact("etl.jar", handler("extract", [])))
    assert v.errors == ()
    assert v.bindings is not None
    (binding,) = v.bindings
    assert (binding.dag_id, binding.task_id) == ("etl", "extract")
    assert (binding.artifact_bundle_name, binding.artifact_rel_path) == (BUNDLE, "etl.jar")
    assert v.report() is None


def test_no_claim_is_an_error_naming_the_bundle() -> None:
    v = verdict_of(dag(stub("extract")), artifact("etl.jar", handler("load", [])))
    assert error_texts(v) == [
        "Dag 'etl', task 'extract': no artifact in Dag bundle 'java-task-handlers' registers it"
    ]
    assert v.bindings is None


def test_no_claim_lists_the_artifacts_that_gave_no_answer() -> None:
    broken = (
        BrokenCandidate(rel_path="b.jar", reason="probe timed out"),
        BrokenCandidate(rel_path="a.jar", reason="no Main-Class"),
    )
    v = verdict_of(dag(stub("extract")), broken=broken)
    assert error_texts(v) == [
        "Dag 'etl', task 'extract': no artifact in Dag bundle 'java-task-handlers' registers it; "
        "no answer from 'a.jar' (no Main-Class), 'b.jar' (probe timed out)"
    ]


def test_two_claims_name_both_artifacts() -> None:
    v = verdict_of(
        dag(stub("extract")),
        artifact("b.jar", handler("extract", [])),
        artifact("a.jar", handler("extract", [])),
    )
    assert error_texts(v) == [
        "Dag 'etl', task 'extract': registered by 'a.jar' and 'b.jar' in Dag bundle "
        "'java-task-handlers'"
    ]
    assert v.bindings is None


def test_three_claims_are_listed_with_commas() -> None:
    v = verdict_of(
        dag(stub("t")),
        *(artifact(f"{n}.jar", handler("t", [])) for n in ("a", "b", "c")),
    )
    assert error_texts(v) == [
        "Dag 'etl', task 't': registered by 'a.jar', 'b.jar' and 'c.jar' in Dag bundle "
        "'java-task-handlers'"
    ]


def test_handler_without_stub_is_fine() -> None:
    v = verdict_of(
        dag(stub("extract")),
        artifact("etl.jar", handler("extract", []), handler("unused", [param("x", INT)])),
    )
    assert v.errors == () and v.warnings == ()


def test_stubs_on_other_queues_are_not_ours() -> None:
    v = verdict_of(dag(stub("extract", queue="go")))
    assert v.errors == ()
    assert v.bindings == ()


def test_dag_without_our_stubs_gets_empty_bindings() -> None:
    # [] (not None): the writer removes rows this bundle held for the Dag.
    v = verdict_of(dag())
    assert v.bindings == ()


def test_one_bad_task_keeps_the_whole_dag_untouched() -> None:
    v = verdict_of(
        dag(stub("good"), stub("bad")),
        artifact("etl.jar", handler("good", [])),
    )
    assert v.bindings is None
    assert len(v.errors) == 1


def test_other_dags_proceed_when_one_has_problems() -> None:
    result = validate_bundle(
        bundle_name=BUNDLE,
        queues=QUEUES,
        dags=[dag(stub("t"), dag_id="bad"), dag(stub("t"), dag_id="good")],
        artifacts=[artifact("g.jar", handler("t", []), dag_id="good")],
    )
    by_id = {v.dag_id: v for v in result.verdicts}
    assert by_id["bad"].bindings is None
    assert by_id["good"].bindings is not None and len(by_id["good"].bindings) == 1
    assert [b.dag_id for b in result.bindings] == ["good"]


def test_mapped_stub_checks_presence_only() -> None:
    v = verdict_of(
        dag(stub("many", [literal_arg("a", "x", STR)], mapped=True)),
        artifact("etl.jar", handler("many", [param(None, INT), param(None, INT)])),
    )
    assert v.errors == () and v.bindings is not None


def test_params_null_checks_presence_only() -> None:
    v = verdict_of(
        dag(stub("t", [literal_arg("a", 1, INT), literal_arg("b", 2, INT)])),
        artifact("etl.ts", handler("t", None, binding="named")),
    )
    assert v.errors == () and v.warnings == ()


def test_unknown_binding_mode_is_an_error() -> None:
    v = verdict_of(
        dag(stub("t", [literal_arg("a", 1, INT)])),
        artifact("etl.jar", handler("t", [param("a", INT)], binding="by_vibes")),
    )
    assert error_texts(v) == [
        "Dag 'etl', task 't': the task handler in 'etl.jar' binds arguments in unknown mode "
        "'by_vibes'"
    ]


@pytest.mark.parametrize("mode", ["named_or_whole", "named_open"])
def test_named_variants_validate_as_named(mode: str) -> None:
    v = verdict_of(
        dag(stub("t", [literal_arg("table_name", "x", STR)])),
        artifact("etl", handler("t", [param("TableName", INT)], binding=mode)),
    )
    assert error_texts(v) == [
        "Dag 'etl', task 't': argument 'table_name' is string, the task handler takes integer"
    ]


# --- positional --------------------------------------------------------------------------------


def test_positional_binds_all_arguments() -> None:
    v = verdict_of(
        dag(stub("t", [literal_arg("region", "emea", STR), xcom_arg("n", "up", INT)])),
        artifact("etl", handler("t", [param(None, STR), param(None, NUM)])),
    )
    assert v.errors == ()


def test_positional_falls_back_to_arguments_without_defaults() -> None:
    v = verdict_of(
        dag(
            stub(
                "t",
                [literal_arg("region", "emea", STR), literal_arg("n", 3, INT, from_default=True)],
            )
        ),
        artifact("etl", handler("t", [param(None, STR)])),
    )
    assert v.errors == ()


def test_positional_count_mismatch() -> None:
    v = verdict_of(
        dag(
            stub(
                "t",
                [
                    literal_arg("a", 1, INT),
                    literal_arg("b", 2, INT, from_default=True),
                    literal_arg("c", 3, INT, from_default=True),
                ],
            )
        ),
        artifact("etl", handler("t", [param(None, INT), param(None, INT)])),
    )
    assert error_texts(v) == [
        "Dag 'etl', task 't': passes 3 argument(s) (1 without defaults), the task handler takes 2"
    ]


def test_argless_stub_against_handler_with_params() -> None:
    v = verdict_of(dag(stub("t")), artifact("etl", handler("t", [param(None, INT)])))
    assert error_texts(v) == [
        "Dag 'etl', task 't': passes 0 argument(s) (0 without defaults), the task handler takes 1"
    ]


def test_positional_type_mismatch() -> None:
    v = verdict_of(
        dag(stub("t", [literal_arg("region", "emea", STR)])),
        artifact("etl", handler("t", [param(None, INT)])),
    )
    assert error_texts(v) == [
        "Dag 'etl', task 't': argument 'region' is string, the task handler takes integer"
    ]


def test_positional_uses_the_defaulted_binding_when_counts_match_all() -> None:
    # all three bound, so the defaulted one is type-checked too
    v = verdict_of(
        dag(stub("t", [literal_arg("a", 1, INT), literal_arg("b", "x", STR, from_default=True)])),
        artifact("etl", handler("t", [param(None, INT), param(None, INT)])),
    )
    assert error_texts(v) == [
        "Dag 'etl', task 't': argument 'b' is string, the task handler takes integer"
    ]


# --- named -------------------------------------------------------------------------------------


def test_named_exact_match() -> None:
    v = verdict_of(
        dag(stub("t", [literal_arg("table_name", "x", STR), literal_arg("limit", 1, INT)])),
        artifact(
            "go",
            handler("t", [param("table_name", STR, exact=True), param("limit", INT)], "named"),
        ),
    )
    assert v.errors == () and v.warnings == ()


def test_named_folded_match() -> None:
    v = verdict_of(
        dag(stub("t", [literal_arg("Table_Name", 3, INT)])),
        artifact("go", handler("t", [param("tablename", STR)], "named")),
    )
    assert error_texts(v) == [
        "Dag 'etl', task 't': argument 'Table_Name' is integer, the task handler takes string"
    ]


def test_named_exact_name_refuses_folded_match() -> None:
    v = verdict_of(
        dag(stub("t", [literal_arg("TableName", "x", STR), literal_arg("other", 1, INT)])),
        artifact("go", handler("t", [param("table_name", STR, exact=True)], "named")),
    )
    assert v.errors == ()
    assert warning_texts(v) == [
        "Dag 'etl', task 't': argument 'TableName' is not taken by the task handler",
        "Dag 'etl', task 't': argument 'other' is not taken by the task handler",
        "Dag 'etl', task 't': the task handler's parameter 'table_name' gets no argument",
    ]
    assert v.bindings is not None  # warnings never block


def test_named_ambiguous_fold_matches_nothing() -> None:
    v = verdict_of(
        dag(stub("t", [literal_arg("a_b", 1, INT), literal_arg("ab_", "x", STR)])),
        artifact("go", handler("t", [param("AB", INT), param("c", INT)], "named")),
    )
    assert v.errors == ()
    assert "Dag 'etl', task 't': the task handler's parameter 'AB' gets no argument" in (
        warning_texts(v)
    )


def test_named_unnamed_param_is_reported_by_index() -> None:
    v = verdict_of(
        dag(stub("t", [literal_arg("a", 1, INT), literal_arg("b", 2, INT)])),
        artifact("go", handler("t", [param("a", INT), param(None, INT)], "named")),
    )
    assert warning_texts(v) == [
        "Dag 'etl', task 't': argument 'b' is not taken by the task handler",
        "Dag 'etl', task 't': the task handler's parameter #1 gets no argument",
    ]


def test_named_defaulted_argument_not_claimed_is_silent() -> None:
    v = verdict_of(
        dag(stub("t", [literal_arg("a", 1, INT), literal_arg("b", 2, INT, from_default=True)])),
        artifact("go", handler("t", [param("a", INT)], "named")),
    )
    assert v.warnings == () and v.errors == ()


def test_named_lone_argument_may_be_the_whole_value() -> None:
    v = verdict_of(
        dag(stub("t", [xcom_arg("payload", "up", OBJ)])),
        artifact("go", handler("t", [param("Table", STR), param("Limit", INT)], "named")),
    )
    assert v.errors == () and v.warnings == ()


def test_named_lone_argument_without_schema_may_be_the_whole_value() -> None:
    v = verdict_of(
        dag(stub("t", [xcom_arg("payload", "up")])),
        artifact("go", handler("t", [param("Table", STR)], "named")),
    )
    assert v.errors == () and v.warnings == ()


def test_named_lone_string_argument_is_not_a_whole_value() -> None:
    v = verdict_of(
        dag(stub("t", [literal_arg("payload", "x", STR)])),
        artifact("go", handler("t", [param("Table", STR)], "named")),
    )
    assert warning_texts(v) == [
        "Dag 'etl', task 't': argument 'payload' is not taken by the task handler",
        "Dag 'etl', task 't': the task handler's parameter 'Table' gets no argument",
    ]


def test_named_whole_value_not_assumed_with_exact_names() -> None:
    v = verdict_of(
        dag(stub("t", [xcom_arg("payload", "up", OBJ)])),
        artifact("go", handler("t", [param("table", STR, exact=True)], "named")),
    )
    assert len(v.warnings) == 2


def test_named_design_a_optional_param_is_not_reported_unfilled() -> None:
    decl = TaskHandlerDeclaration(
        task_id="t",
        binding="named",
        params=[TaskHandlerParam(name="a", required=False), TaskHandlerParam(name="b")],
    )
    v = verdict_of(
        dag(stub("t", [literal_arg("c", 1, INT), literal_arg("d", 1, INT)])), artifact("x", decl)
    )
    assert (
        "Dag 'etl', task 't': the task handler's parameter 'b' gets no argument" in warning_texts(v)
    )
    assert not any("'a' gets no argument" in w for w in warning_texts(v))


# --- types -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "types"),
    [
        (INT, ("integer",)),
        ({"type": ["string", "null"]}, ("string", "null")),
        (OPT_INT, ("integer", "null")),
        ({"oneOf": [STR, NUM]}, ("string", "number")),
        ({"const": 3}, ("integer",)),
        (
            {"enum": ["a", 1, None, True, 1.5, [1], {"a": 1}]},
            ("string", "integer", "null", "boolean", "number", "array", "object"),
        ),
        ({"type": "string", "enum": ["a", "b"]}, ("string",)),
        ({"$ref": "#/defs/x"}, None),
        ({"allOf": [INT]}, None),
        ({"anyOf": [INT, {"$ref": "#/x"}]}, None),
        ({"type": 3}, None),
        ({"type": []}, None),
        (None, None),
        # Malformed combinators are not compared, nor do they hide a const that follows.
        ({"anyOf": []}, None),
        ({"anyOf": "x", "const": 1}, ("integer",)),
        ({"oneOf": {"a": INT}}, None),
        ({"enum": "abc"}, None),
        ({"enum": []}, None),
    ],
)
def test_schema_types(schema: dict[str, Any] | None, types: tuple[str, ...] | None) -> None:
    assert schema_types(schema) == types


@pytest.mark.parametrize(
    ("stub_schema", "handler_schema", "ok"),
    [
        (INT, NUM, True),  # integer fits number
        (NUM, INT, False),
        (INT, INT, True),
        (OPT_INT, INT, False),  # may be null, handler refuses null
        (OPT_INT, OPT_INT, True),
        (INT, OPT_INT, True),
        ({"type": "null"}, {"type": "null"}, True),
        ({"type": "null"}, INT, False),
        ({"anyOf": [INT, STR]}, STR, True),  # overlap is enough
        ({"type": "string", "format": "date-time"}, {"type": "string", "format": "date"}, True),
        (None, INT, True),
        (INT, None, True),
        ({"$ref": "#/x"}, INT, True),
        ({"type": "array", "items": STR}, {"type": "array", "items": INT}, True),
    ],
)
def test_compare_value_schemas(
    stub_schema: dict[str, Any] | None, handler_schema: dict[str, Any] | None, ok: bool
) -> None:
    assert (compare_value_schemas(stub_schema, handler_schema) is None) is ok


def test_null_rule_message() -> None:
    v = verdict_of(
        dag(stub("t", [xcom_arg("n", "up", OPT_INT)])),
        artifact("etl", handler("t", [param(None, INT)])),
    )
    assert error_texts(v) == [
        "Dag 'etl', task 't': argument 'n' is integer or null, the task handler takes integer"
    ]


def test_multiple_handler_types_are_joined_with_or() -> None:
    v = verdict_of(
        dag(stub("t", [xcom_arg("n", "up", {"type": "boolean"})])),
        artifact("etl", handler("t", [param(None, {"anyOf": [INT, STR]})])),
    )
    assert error_texts(v) == [
        "Dag 'etl', task 't': argument 'n' is boolean, the task handler takes integer or string"
    ]


def test_fold_name() -> None:
    assert fold_name("Table_Name") == fold_name("tablename") == "tablename"


# --- read problems and reports -----------------------------------------------------------------


def test_read_problem_on_our_queue_blocks_the_dag() -> None:
    problem = DagReadProblem(
        message="_arg_bindings is a string, expected a list", task_id="t", queue="java"
    )
    v = verdict_of(dag(stub("other"), problems=(problem,)), artifact("x", handler("other", [])))
    assert error_texts(v) == ["Dag 'etl', task 't': _arg_bindings is a string, expected a list"]
    assert v.bindings is None


def test_read_problem_on_another_queue_is_ignored() -> None:
    problem = DagReadProblem(message="odd", task_id="t", queue="go")
    v = verdict_of(dag(problems=(problem,)))
    assert v.errors == () and v.bindings == ()


def test_read_problem_with_unknown_queue_concerns_every_bundle() -> None:
    problem = DagReadProblem(message="the serialized Dag has no 'dag' object")
    v = verdict_of(dag(problems=(problem,)))
    assert error_texts(v) == ["Dag 'etl': the serialized Dag has no 'dag' object"]


def test_report_lists_dag_problems_first_then_tasks_in_order() -> None:
    problems = (DagReadProblem(message="tasks[3] is a string, expected an operator"),)
    v = verdict_of(dag(stub("b"), stub("a"), problems=problems))
    assert v.report() == (
        "Stub tasks in etl.py do not match their task handlers:\n"
        "- Dag 'etl': tasks[3] is a string, expected an operator\n"
        "- Dag 'etl', task 'a': no artifact in Dag bundle 'java-task-handlers' registers it\n"
        "- Dag 'etl', task 'b': no artifact in Dag bundle 'java-task-handlers' registers it"
    )


def test_report_with_warnings_only() -> None:
    v = verdict_of(
        dag(stub("t", [literal_arg("a", 1, INT)])),
        artifact("go", handler("t", [param("zzz", INT, exact=True)], "named")),
    )
    assert v.report() == (
        "Stub tasks in etl.py match with warnings:\n"
        "- warning: Dag 'etl', task 't': argument 'a' is not taken by the task handler\n"
        "- warning: Dag 'etl', task 't': the task handler's parameter 'zzz' gets no argument"
    )


def test_problems_carry_their_identity() -> None:
    v = verdict_of(dag(stub("t")))
    (problem,) = v.errors
    assert (problem.severity, problem.kind, problem.dag_id, problem.task_id) == (
        "error",
        "unbound",
        "etl",
        "t",
    )
    assert problem.relative_fileloc == "etl.py"


# --- behaviours a one-operator change would break silently -------------------------------------


def test_a_stub_on_another_queue_sorting_first_does_not_hide_the_dags_own_stubs() -> None:
    # "a_other" sorts before "b_ours" and "c_ours": a `continue` turned `break` would skip them,
    # and the writer would then delete the Dag's rows as if it had no stubs on our queues.
    result = validate_bundle(
        bundle_name=BUNDLE,
        queues=QUEUES,
        dags=[dag(stub("a_other", queue="python"), stub("b_ours"), stub("c_ours"))],
        artifacts=[artifact("etl.jar", handler("b_ours", []), handler("c_ours", None))],
    )
    (verdict,) = result.verdicts
    assert verdict.errors == ()
    assert [(b.task_id, b.artifact_rel_path) for b in verdict.bindings or ()] == [
        ("b_ours", "etl.jar"),
        ("c_ours", "etl.jar"),
    ]


def test_problems_after_an_ambiguous_task_are_still_reported() -> None:
    v = verdict_of(
        dag(stub("a_twice"), stub("b_unbound"), stub("c_wrong_type", [literal_arg("x", "s", STR)])),
        artifact("one.jar", handler("a_twice", []), handler("c_wrong_type", [param(None, INT)])),
        artifact("two.jar", handler("a_twice", [])),
    )
    assert error_texts(v) == [
        "Dag 'etl', task 'a_twice': registered by 'one.jar' and 'two.jar' in Dag bundle "
        f"{BUNDLE!r}",
        f"Dag 'etl', task 'b_unbound': no artifact in Dag bundle {BUNDLE!r} registers it",
        "Dag 'etl', task 'c_wrong_type': argument 'x' is string, the task handler takes integer",
    ]
    assert v.bindings is None


def test_a_nullable_argument_against_a_nullable_parameter_of_another_type_is_an_error() -> None:
    v = verdict_of(
        dag(stub("t", [xcom_arg("n", "up", OPT_INT)])),
        artifact("etl", handler("t", [param(None, {"anyOf": [STR, {"type": "null"}]})])),
    )
    assert error_texts(v) == [
        "Dag 'etl', task 't': argument 'n' is integer or null, the task handler takes string "
        "or null"
    ]


def test_a_nullable_argument_against_a_nullable_parameter_of_its_type_binds() -> None:
    v = verdict_of(
        dag(stub("t", [xcom_arg("n", "up", OPT_INT)])),
        artifact("etl", handler("t", [param(None, {"anyOf": [NUM, {"type": "null"}]})])),
    )
    assert v.errors == () and v.bindings is not None


def test_a_named_handler_whose_stub_passes_nothing_reports_each_unfilled_parameter() -> None:
    v = verdict_of(
        dag(stub("t")),
        artifact("go", handler("t", [param("Table", STR), param(None, INT)], "named")),
    )
    assert v.errors == ()
    assert warning_texts(v) == [
        "Dag 'etl', task 't': the task handler's parameter 'Table' gets no argument",
        "Dag 'etl', task 't': the task handler's parameter #1 gets no argument",
    ]


# --- an artifact that registers nothing ------------------------------------------------------


def test_an_empty_answer_is_a_problem_on_its_artifact_and_named_in_unbound_errors() -> None:
    empty = TaskHandlerArtifact(
        bundle_name=BUNDLE, relative_fileloc="old-sdk.jar", size_bytes=1, task_handlers={}
    )
    result = validate_bundle(
        bundle_name=BUNDLE,
        queues=QUEUES,
        dags=[dag(stub("t"))],
        artifacts=[empty, artifact("other.jar", handler("u", []))],
    )
    (problem,) = result.artifact_problems
    assert problem.model_dump() == {
        "severity": "warning",
        "kind": "empty_answer",
        "message": (
            f"Artifact 'old-sdk.jar' in Dag bundle {BUNDLE!r} registers no task handler; if it "
            "implements stub tasks, the likely cause is that an older Go or Java SDK runtime "
            "answers only the Dags named in the probe request's dag_ids"
        ),
        "dag_id": None,
        "task_id": None,
        "relative_fileloc": "old-sdk.jar",
        "other_bundle": None,
    }
    (verdict,) = result.verdicts
    assert error_texts(verdict) == [
        f"Dag 'etl', task 't': no artifact in Dag bundle {BUNDLE!r} registers it; 'old-sdk.jar' "
        "registered no task handler at all (an older Go or Java SDK runtime answers only the "
        "Dags named in the probe request's dag_ids?)"
    ]
    assert result.problems[0] == problem


def test_artifacts_with_handlers_raise_no_empty_answer_problem() -> None:
    result = validate_bundle(
        bundle_name=BUNDLE,
        queues=QUEUES,
        dags=[dag(stub("t"))],
        artifacts=[artifact("a.jar", handler("t", []))],
    )
    assert result.artifact_problems == ()
    assert result.problems == ()


def test_task_problems_are_ordered_by_task_whatever_found_them_first() -> None:
    # A read problem about task "z" is found before the stubs are walked; the report still
    # lists task "a" first.
    read = DagReadProblem(message="z's _arg_bindings is unreadable", task_id="z", queue="java")
    v = verdict_of(dag(stub("a"), problems=(read,)))
    assert [p.task_id for p in v.errors] == ["a", "z"]

"""The scheduler read path without a database: payload handling and import weight."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest

from taskhandler_operator.records import BundleInfo, TaskHandlerArtifactRef
from taskhandler_operator.scheduler import (
    TaskLookup,
    attach_task_handlers,
    no_record_reason,
    routed_keys,
    routed_queues_from_config,
    workload_key,
)


def payload(dag_id: str, task_id: str) -> dict[str, Any]:
    return {
        "type": "ExecuteTask",
        "ti": {"dag_id": dag_id, "task_id": task_id, "run_id": "r", "try_number": 1},
        "dag_rel_path": f"{dag_id}.py",
        "bundle_info": {"name": "dags-folder", "version": None},
    }


def test_scheduler_module_imports_without_kopf_or_kubernetes() -> None:
    code = textwrap.dedent(
        """
        import sys
        import taskhandler_operator.scheduler
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("kopf", "kubernetes"))
        print(",".join(heavy))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert proc.stdout.strip() == ""


def test_attach_sets_reference_and_lists_unbound_stubs() -> None:
    ref = TaskHandlerArtifactRef(bundle_info=BundleInfo(name="java"), rel_path="etl/app.jar")
    workloads = [payload("etl", "extract"), payload("etl", "python"), payload("etl", "load")]
    result = attach_task_handlers(
        workloads,
        {("etl", "extract"): ref},
        stub_keys={("etl", "extract"), ("etl", "load")},
    )
    assert [w["task_handler_artifact"] for w in result.workloads] == [
        {"bundle_info": {"name": "java", "version": None}, "rel_path": "etl/app.jar"},
        None,
        None,
    ]
    assert result.unbound == [("etl", "load")]
    # the input payloads are not modified
    assert "task_handler_artifact" not in workloads[0]
    assert result.workloads[0]["ti"] == workloads[0]["ti"]


def test_attach_can_use_the_design_a_field_name() -> None:
    ref = TaskHandlerArtifactRef(bundle_info=BundleInfo(name="go"), rel_path="bin/etl")
    result = attach_task_handlers(
        [payload("d", "t")], {("d", "t"): ref}, stub_keys=(), field="task_handler"
    )
    assert result.workloads[0]["task_handler"]["rel_path"] == "bin/etl"


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        ({}, "workload has no 'ti' object"),
        ({"ti": "x"}, "workload has no 'ti' object"),
        ({"ti": {"dag_id": "d"}}, "workload 'ti' lacks a string dag_id or task_id"),
        ({"ti": {"dag_id": 1, "task_id": "t"}}, "workload 'ti' lacks a string dag_id or task_id"),
    ],
)
def test_malformed_workloads_are_refused(workload: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        workload_key(workload)
    assert str(caught.value) == message


def test_generic_reason_names_dag_and_task() -> None:
    assert no_record_reason(("etl", "load")) == (
        "Dag 'etl', task 'load': no task handler binding is recorded; no TaskHandlerBundle "
        "serves the stub's queue, or its bundle has not been reconciled since the Dag changed"
    )


def test_routed_queues_are_the_keys_of_queue_to_coordinator() -> None:
    assert routed_queues_from_config('{"java": "jdk-17", "go": "go-sdk"}') == {"java", "go"}
    assert routed_queues_from_config(None) == frozenset()
    assert routed_queues_from_config("  ") == frozenset()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "{nope",
            "[sdk] queue_to_coordinator is not JSON: Expecting property name enclosed in "
            "double quotes: line 1 column 2 (char 1)",
        ),
        (
            '["java"]',
            "[sdk] queue_to_coordinator must be a JSON object mapping queue names to "
            "coordinator keys",
        ),
        (
            '{"java": 17}',
            "[sdk] queue_to_coordinator must be a JSON object mapping queue names "
            "to coordinator keys",
        ),
    ],
)
def test_bad_queue_to_coordinator_is_one_line(value: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        routed_queues_from_config(value)
    assert str(caught.value) == message


def test_routing_keeps_routed_queues_and_the_default_queue_for_queueless_tasks() -> None:
    tasks: list[TaskLookup] = [
        ("etl", "extract", "java"),
        ("etl", "load", None),  # no queue: the default queue
        ("etl", "empty", ""),  # empty: the default queue too
        ("etl", "python", "celery"),
        ("etl", "pair"),  # a pair has no queue: the default queue
        ("etl", "extract", "java"),  # duplicates collapse
    ]
    assert routed_keys(tasks, {"java"}) == [("etl", "extract")]
    assert routed_keys(tasks, {"java", "default"}) == [
        ("etl", "extract"),
        ("etl", "load"),
        ("etl", "empty"),
        ("etl", "pair"),
    ]
    assert routed_keys(tasks, {"java", "main"}, default_queue="main") == routed_keys(
        tasks, {"java", "default"}
    )
    # Airflow with queue_to_coordinator unset looks nothing up.
    assert routed_keys(tasks, frozenset()) == []
    # No routing given: everything is resolved.
    assert routed_keys(tasks, None) == [
        ("etl", "extract"),
        ("etl", "load"),
        ("etl", "empty"),
        ("etl", "python"),
        ("etl", "pair"),
    ]


def test_attach_leaves_unrouted_stubs_alone() -> None:
    ref = TaskHandlerArtifactRef(bundle_info=BundleInfo(name="java"), rel_path="etl/app.jar")
    on_java = payload("etl", "extract")
    on_java["ti"]["queue"] = "java"
    on_celery = payload("etl", "python")
    on_celery["ti"]["queue"] = "celery"
    queueless = payload("etl", "load")  # the default queue
    refs = {("etl", "extract"): ref, ("etl", "python"): ref, ("etl", "load"): ref}
    stubs = {("etl", "extract"), ("etl", "python"), ("etl", "load")}
    result = attach_task_handlers(
        [on_java, on_celery, queueless], refs, stub_keys=stubs, routed_queues={"java"}
    )
    assert [w["task_handler_artifact"] is not None for w in result.workloads] == [
        True,
        False,
        False,
    ]
    assert result.unbound == []
    routed_default = attach_task_handlers(
        [on_java, on_celery, queueless], {}, stub_keys=stubs, routed_queues={"java", "default"}
    )
    assert routed_default.unbound == [("etl", "extract"), ("etl", "load")]


def test_a_workload_queue_that_is_not_a_string_is_refused() -> None:
    bad = payload("etl", "extract")
    bad["ti"]["queue"] = 7
    with pytest.raises(ValueError, match=r"^workload 'ti' has a queue that is not a string$"):
        attach_task_handlers([bad], {}, stub_keys=set(), routed_queues={"java"})

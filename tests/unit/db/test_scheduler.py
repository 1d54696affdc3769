"""The scheduler read path without a database: payload handling and import weight."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from taskhandler_operator.records import BundleInfo, TaskHandlerArtifactRef
from taskhandler_operator.scheduler import (
    CoordinatorConfigError,
    TaskLookup,
    attach_task_handlers,
    no_record_reason,
    parse_queue_to_coordinator,
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


# Airflow's own cases (``TestGetTaskHandlerArtifactRefs``'s invalid-configuration test and
# ``CoordinatorManager``'s validation tests): a warning on each call and nothing routed.
GO_COORDINATORS = (
    '{"go": {"classpath": "airflow.sdk.coordinators.executable.ExecutableCoordinator"}}'
)


@pytest.mark.parametrize(
    ("queue_to_coordinator", "coordinators", "message"),
    [
        pytest.param('["go"]', None, "must be a JSON object", id="queue-to-coordinator-as-array"),
        pytest.param(
            '{"golang": ["go"]}',
            GO_COORDINATORS,
            "coordinator of queue 'golang' must be a non-empty string",
            id="queue-to-coordinator-with-list-value",
        ),
        pytest.param('"abc"', None, "must be a JSON object", id="string"),
        pytest.param("42", None, "must be a JSON object", id="int"),
        pytest.param('{"golang": ""}', None, "non-empty string", id="empty-value"),
        pytest.param("{nope", None, "is not JSON", id="malformed-json"),
        pytest.param(
            '{"golang": "missing"}',
            GO_COORDINATORS,
            "references unknown coordinator 'missing'",
            id="unknown-coordinator",
        ),
        pytest.param(
            '{"golang": "go"}', "{not json", "[sdk] coordinators is not JSON", id="bad-coordinators"
        ),
        pytest.param(
            '{"golang": "go"}', "[]", "coordinators must be a JSON object", id="coordinators-array"
        ),
        pytest.param(
            '{"golang": "go"}', "null", "unknown coordinator 'go'", id="coordinators-as-null"
        ),
    ],
)
def test_invalid_sdk_configuration_warns_each_time_and_routes_nothing(
    queue_to_coordinator: str,
    coordinators: str | None,
    message: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="taskhandler_operator.scheduler"):
        assert routed_queues_from_config(queue_to_coordinator, coordinators) == frozenset()
        assert routed_queues_from_config(queue_to_coordinator, coordinators) == frozenset()
    warnings = [r for r in caplog.records if "[sdk] coordinator configuration" in r.getMessage()]
    assert len(warnings) == 2
    assert all(r.levelno == logging.WARNING and r.exc_info for r in warnings)
    first = warnings[0].exc_info
    assert first is not None and message in str(first[1])
    with pytest.raises(CoordinatorConfigError, match=re.escape(message)):
        parse_queue_to_coordinator(queue_to_coordinator, coordinators)
    # Nothing routed means nothing looked up: no stub gets a key, so no statement runs.
    routed = routed_queues_from_config(queue_to_coordinator, coordinators)
    assert routed_keys([("etl", "load", "golang")], routed) == []


@pytest.mark.parametrize("value", [None, "", "  ", "null", "{}"])
def test_unset_or_null_queue_to_coordinator_routes_nothing_without_a_warning(
    value: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="taskhandler_operator.scheduler"):
        assert routed_queues_from_config(value, GO_COORDINATORS) == frozenset()
    assert caplog.records == []


def test_valid_configuration_routes_its_queues_with_known_coordinators() -> None:
    assert routed_queues_from_config('{"golang": "go", "gx": "go"}', GO_COORDINATORS) == {
        "golang",
        "gx",
    }


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

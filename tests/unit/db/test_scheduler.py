"""The scheduler read path without a database: payload handling and import weight."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest

from taskhandler_operator.records import BundleInfo, TaskHandlerArtifactRef
from taskhandler_operator.scheduler import attach_task_handlers, no_record_reason, workload_key


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

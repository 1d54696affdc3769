"""Reading stub tasks out of serialized Dag documents (pure)."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import pytest

from taskhandler_devenv.serialized_dags import (
    dag_document,
    literal_arg,
    python_task,
    stub_task,
    xcom_arg,
)
from taskhandler_operator.airflow.serialized import (
    DagReadProblem,
    DocumentError,
    decode_document,
    read_stubs,
)

NOT_JSON = (
    "the serialized Dag is not JSON (Expecting property name enclosed in double quotes: "
    "line 1 column 2 (char 1))"
)
# Written by Airflow 3.3.2 itself (copied from the project's reference notes).
SAMPLE = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "serialized-dag-sample.json"


def read(document: Any, **kwargs: Any) -> Any:
    return read_stubs(
        document, dag_id="etl", bundle_name="dags-folder", relative_fileloc="etl.py", **kwargs
    )


def test_airflow_written_sample_has_no_stubs() -> None:
    stubs = read(json.loads(SAMPLE.read_text()))
    assert stubs.stubs == () and stubs.problems == ()


def test_stubs_with_queue_default_and_arguments() -> None:
    document = dag_document(
        "etl",
        [
            python_task("plain", queue="java"),
            stub_task("extract", queue="java", arg_bindings=[literal_arg("region", "emea")]),
            stub_task("load", arg_bindings=[xcom_arg("rows", "extract")]),
            stub_task("ping"),
            stub_task("many", queue="java", mapped=True),
        ],
    )
    stubs = read(document, default_queue="default")
    by_id = {s.task_id: s for s in stubs.stubs}
    assert sorted(by_id) == ["extract", "load", "many", "ping"]
    assert by_id["extract"].queue == "java"
    assert by_id["load"].queue == "default"  # no queue key: the default queue
    assert by_id["ping"].arg_bindings is None
    assert by_id["many"].mapped and not by_id["extract"].mapped
    assert by_id["load"].arg_bindings is not None
    assert by_id["load"].arg_bindings[0].name == "rows"
    assert stubs.problems == ()


def test_configured_default_queue_is_used() -> None:
    stubs = read(dag_document("etl", [stub_task("t")]), default_queue="celery")
    assert stubs.stubs[0].queue == "celery"


def test_null_queue_means_default() -> None:
    stubs = read(dag_document("etl", [stub_task("t", queue=None)]))
    assert stubs.stubs[0].queue == "default"


def test_unversioned_task_layout_is_read() -> None:
    document = {"dag": {"tasks": [{"task_id": "t", "is_stub": True, "queue": "go"}]}}
    assert read(document).stubs[0].queue == "go"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([], "the serialized Dag has no 'dag' object"),
        ({"__version": 3}, "the serialized Dag has no 'dag' object"),
        ({"dag": "x"}, "the serialized Dag has no 'dag' object"),
        ({"dag": {}}, "the serialized Dag has no 'tasks', expected a list"),
        (
            {"dag": {"tasks": {"a": 1}}},
            "the serialized Dag has 'tasks' as an object, expected a list",
        ),
    ],
)
def test_document_problems_concern_every_queue(document: Any, message: str) -> None:
    stubs = read(document)
    assert stubs.stubs == ()
    assert stubs.problems == (DagReadProblem(message=message),)


def test_task_problems_keep_the_other_tasks() -> None:
    good = stub_task("good", queue="java")
    bad_bindings = stub_task("bad", queue="java")
    bad_bindings["__var"]["_arg_bindings"] = {"region": "emea"}
    bad_queue = stub_task("q")
    bad_queue["__var"]["queue"] = 7
    bad_flag = python_task("flag", queue="go")
    bad_flag["__var"]["is_stub"] = "yes"
    no_id = stub_task("x", queue="java")
    del no_id["__var"]["task_id"]
    tasks: list[Any] = [good, bad_bindings, bad_queue, bad_flag, "junk", no_id]
    document = dag_document("etl", tasks)
    stubs = read(document)
    assert [s.task_id for s in stubs.stubs] == ["good"]
    assert stubs.problems == (
        DagReadProblem(
            message="_arg_bindings is an object, expected a list of arguments",
            task_id="bad",
            queue="java",
        ),
        DagReadProblem(
            message="stub task 'q' has queue as a number, expected a string", task_id="q"
        ),
        DagReadProblem(
            message="task 'flag' has is_stub as a string, expected true or false",
            task_id="flag",
            queue="go",
        ),
        DagReadProblem(message="tasks[4] is a string, expected an operator"),
        DagReadProblem(message="stub tasks[5] has no task_id", queue="java"),
    )


def test_non_stub_oddities_are_not_our_business() -> None:
    odd = python_task("plain")
    odd["__var"]["queue"] = 5
    odd["__var"]["_arg_bindings"] = "x"
    assert read(dag_document("etl", [odd])).problems == ()


def test_decode_plain_parsed_text_and_compressed() -> None:
    document = dag_document("etl", [stub_task("t")])
    text = json.dumps(document)
    assert decode_document(document, None) == document
    assert decode_document(text, None) == document
    assert decode_document(None, zlib.compress(text.encode())) == document


@pytest.mark.parametrize(
    ("data", "compressed", "message"),
    [
        (None, None, "the serialized_dag row holds neither data nor data_compressed"),
        (
            None,
            b"not zlib",
            "data_compressed is not zlib data (Error -3 while decompressing data: incorrect "
            "header check)",
        ),
        (
            None,
            zlib.compress(b"{nope"),
            NOT_JSON,
        ),
        (
            "{nope",
            None,
            NOT_JSON,
        ),
    ],
)
def test_decode_errors(data: Any, compressed: bytes | None, message: str) -> None:
    with pytest.raises(DocumentError) as caught:
        decode_document(data, compressed)
    assert str(caught.value) == message

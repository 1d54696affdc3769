"""Stub tasks out of one serialized Dag document (pure; no I/O).

Layout, as Airflow 3.3 writes it (``reference/serialized-dag-sample.json``)::

    {"__version": 3, "dag": {"dag_id", "relative_fileloc", "tasks": [
        {"__type": "operator", "__var": {"task_id", "queue"?, "_is_mapped"?, ...}}]}}

Newer Airflow adds ``is_stub: true``, ``_arg_bindings`` and (as before) ``queue`` to a stub's
``__var``; a task on the default queue has no ``queue`` key. Whatever does not fit that shape
becomes a :class:`DagReadProblem` for the Dag, never an exception: one odd Dag must not stop the
inventory of the others.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any

from taskhandler_operator.airflow.arg_bindings import (
    LiteralArgBinding,
    XComArgBinding,
    describe_json_type,
    parse_arg_bindings,
)

#: Airflow's ``[operators] default_queue`` default.
DEFAULT_QUEUE = "default"


# The inventory holds one of these per stub of every live Dag (20,000 at 1,000 bundles x 20):
# slotted dataclasses, built only by the reader below, take a fifth of a pydantic model's memory
# (no per-instance __dict__ and fields-set). The parsing boundary is the arg bindings' models.
@dataclass(frozen=True, slots=True)
class StubTask:
    task_id: str
    queue: str
    # None: the stub takes no arguments (Airflow writes no _arg_bindings).
    arg_bindings: tuple[XComArgBinding | LiteralArgBinding, ...] | None = None
    # Mapped stubs get per-index arguments at run time: only their handler's presence is checked.
    mapped: bool = False

    def to_json(self) -> dict[str, Any]:
        bindings = self.arg_bindings
        return {
            "task_id": self.task_id,
            "queue": self.queue,
            "arg_bindings": None
            if bindings is None
            else [b.model_dump(mode="json") for b in bindings],
            "mapped": self.mapped,
        }


@dataclass(frozen=True, slots=True)
class DagReadProblem:
    """Something in the document we could not read.

    ``queue`` is the queue of the task it concerns when known; None means "could be any
    queue", so every bundle treats the Dag as unreadable.
    """

    message: str
    task_id: str | None = None
    queue: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"message": self.message, "task_id": self.task_id, "queue": self.queue}


@dataclass(frozen=True, slots=True)
class DagStubs:
    """The stub inventory of one Dag: where it lives and its stub tasks."""

    dag_id: str
    bundle_name: str
    relative_fileloc: str
    dag_hash: str = ""
    stubs: tuple[StubTask, ...] = ()
    problems: tuple[DagReadProblem, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """JSON-ready fields, nested ones included (the pass key digests them)."""
        return {
            "dag_id": self.dag_id,
            "bundle_name": self.bundle_name,
            "relative_fileloc": self.relative_fileloc,
            "dag_hash": self.dag_hash,
            "stubs": [stub.to_json() for stub in self.stubs],
            "problems": [problem.to_json() for problem in self.problems],
        }


class DocumentError(ValueError):
    """The row's document could not be decoded at all."""


def decode_document(data: Any, data_compressed: bytes | None) -> Any:
    """The JSON document of a ``serialized_dag`` row.

    ``data`` is the jsonb column (already parsed, or its text), ``data_compressed`` the bytea
    column Airflow fills instead when ``[core] compress_serialized_dags`` is on: zlib over the
    UTF-8 JSON text.
    """
    if data_compressed is not None:
        try:
            text = zlib.decompress(data_compressed)
        except zlib.error as exc:
            raise DocumentError(f"data_compressed is not zlib data ({exc})") from None
        return _loads(text)
    if data is None:
        raise DocumentError("the serialized_dag row holds neither data nor data_compressed")
    if isinstance(data, str | bytes):
        return _loads(data)
    return data


def _loads(text: str | bytes) -> Any:
    try:
        return json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DocumentError(f"the serialized Dag is not JSON ({exc})") from None


def read_stubs(
    document: Any,
    *,
    dag_id: str,
    bundle_name: str,
    relative_fileloc: str,
    dag_hash: str = "",
    default_queue: str = DEFAULT_QUEUE,
) -> DagStubs:
    """Every ``is_stub`` task of a serialized Dag, with its queue and arguments."""

    def result(stubs: list[StubTask], problems: list[DagReadProblem]) -> DagStubs:
        return DagStubs(
            dag_id=dag_id,
            bundle_name=bundle_name,
            relative_fileloc=relative_fileloc,
            dag_hash=dag_hash,
            stubs=tuple(stubs),
            problems=tuple(problems),
        )

    dag = document.get("dag") if isinstance(document, dict) else None
    if not isinstance(dag, dict):
        return result([], [DagReadProblem(message="the serialized Dag has no 'dag' object")])
    tasks = dag.get("tasks")
    if not isinstance(tasks, list):
        found = "no 'tasks'" if tasks is None else f"'tasks' as {describe_json_type(tasks)}"
        return result(
            [], [DagReadProblem(message=f"the serialized Dag has {found}, expected a list")]
        )

    stubs: list[StubTask] = []
    problems: list[DagReadProblem] = []
    for index, entry in enumerate(tasks):
        read = _read_task(index, entry, default_queue)
        if isinstance(read, StubTask):
            stubs.append(read)
        elif read is not None:
            problems.append(read)
    return result(stubs, problems)


def _read_task(index: int, entry: Any, default_queue: str) -> StubTask | DagReadProblem | None:
    """A stub, a problem, or None for a task that is not a stub."""
    # Serialization versions before 2 stored operators without the __type/__var envelope.
    fields = entry.get("__var", entry) if isinstance(entry, dict) else None
    if not isinstance(fields, dict):
        return DagReadProblem(
            message=f"tasks[{index}] is {describe_json_type(entry)}, expected an operator"
        )
    is_stub = fields.get("is_stub", False)
    task_id = fields.get("task_id")
    name = f"task {task_id!r}" if isinstance(task_id, str) else f"tasks[{index}]"
    if not isinstance(is_stub, bool):
        queue = fields.get("queue", default_queue)
        return DagReadProblem(
            message=f"{name} has is_stub as {describe_json_type(is_stub)}, expected true or false",
            task_id=task_id if isinstance(task_id, str) else None,
            queue=queue if isinstance(queue, str) else None,
        )
    if not is_stub:
        return None
    queue = fields.get("queue", default_queue)
    if queue is None:
        queue = default_queue
    if not isinstance(task_id, str) or not task_id:
        return DagReadProblem(
            message=f"stub tasks[{index}] has no task_id",
            queue=queue if isinstance(queue, str) else None,
        )
    if not isinstance(queue, str):
        return DagReadProblem(
            message=f"stub {name} has queue as {describe_json_type(queue)}, expected a string",
            task_id=task_id,
        )
    mapped = fields.get("_is_mapped") is True
    parsed = parse_arg_bindings(fields.get("_arg_bindings"))
    if parsed.problems:
        return DagReadProblem(message="; ".join(parsed.problems), task_id=task_id, queue=queue)
    return StubTask(task_id=task_id, queue=queue, arg_bindings=parsed.bindings, mapped=mapped)

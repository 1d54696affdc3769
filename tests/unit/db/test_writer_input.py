"""The write path's input checks and keys (no database)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from taskhandler_operator.db.tables import (
    declared_task_handlers,
    fileloc_hash,
    stored_task_handlers,
)
from taskhandler_operator.db.write_models import BundlePass
from taskhandler_operator.db.write_statements import bundle_lock_key, problem_key
from taskhandler_operator.records import (
    ArtifactRecord,
    BundleOwner,
    BundleProblem,
    TaskHandlerArtifact,
    TaskHandlerBinding,
    TaskHandlerDeclaration,
    TaskHandlerParam,
)
from taskhandler_operator.validation import DagVerdict

OWNER = BundleOwner(cluster_id="c", namespace="ns", name="b", uid="u")


def record(path: str, bundle: str = "b") -> ArtifactRecord:
    return ArtifactRecord(
        artifact=TaskHandlerArtifact(bundle_name=bundle, relative_fileloc=path, size_bytes=1)
    )


def verdict(dag_id: str, *bindings: tuple[str, str, str, str]) -> DagVerdict:
    return DagVerdict(
        dag_id=dag_id,
        bundle_name="dags-folder",
        relative_fileloc=f"{dag_id}.py",
        bindings=tuple(
            TaskHandlerBinding(dag_id=d, task_id=t, artifact_bundle_name=b, artifact_rel_path=p)
            for d, t, b, p in bindings
        ),
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"artifacts": (record("a.jar", bundle="other"),)},
            "artifact 'a.jar' belongs to bundle 'other', not 'b'",
        ),
        ({"artifacts": (record("a.jar"), record("a.jar"))}, "artifact 'a.jar' is listed twice"),
        ({"verdicts": (verdict("d"), verdict("d"))}, "Dag 'd' has two verdicts"),
        (
            {
                "verdicts": (verdict("d", ("x", "t", "b", "a.jar")),),
                "artifacts": (record("a.jar"),),
            },
            "Dag 'd' carries a binding of Dag 'x'",
        ),
        (
            {
                "verdicts": (verdict("d", ("d", "t", "z", "a.jar")),),
                "artifacts": (record("a.jar"),),
            },
            "Dag 'd', task 't' is bound to bundle 'z', not 'b'",
        ),
        (
            {"verdicts": (verdict("d", ("d", "t", "b", "gone.jar")),)},
            "Dag 'd', task 't' is bound to 'gone.jar', which is not among the pass's artifacts",
        ),
    ],
)
def test_inconsistent_passes_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        BundlePass(bundle_name="b", owner=OWNER, queues=("b",), **kwargs)
    assert caught.value.errors()[0]["msg"] == f"Value error, {message}"


def test_problem_key_is_stable_and_distinguishes() -> None:
    p = BundleProblem(severity="error", kind="unbound", message="m", dag_id="d", task_id="t")
    assert problem_key(p) == problem_key(p.model_copy())
    assert len(problem_key(p)) == 32
    assert problem_key(p) != problem_key(p.model_copy(update={"severity": "warning"}))
    assert problem_key(p) != problem_key(p.model_copy(update={"message": "n"}))


def test_bundle_lock_key_is_a_signed_64_bit_constant() -> None:
    key = bundle_lock_key("java")
    assert key == bundle_lock_key("java") != bundle_lock_key("go")
    assert -(2**63) <= key < 2**63


def test_fileloc_hash_is_md5_hex_of_utf8() -> None:
    assert fileloc_hash("etl.py") == "2eab6485ceae00be7385d6a3fc438b82"
    assert fileloc_hash("dags/ü.py") == "1a10a9c68d13b1eb3f0a794426ac50cd"


def test_stored_task_handlers_keep_design_b_shape() -> None:
    handlers = {
        "etl": [
            TaskHandlerDeclaration(task_id="a", binding="named", params=None),
            TaskHandlerDeclaration(
                task_id="b",
                params=[
                    TaskHandlerParam(name=None, value_schema={"type": "string"}),
                    TaskHandlerParam(name="x", exact_name=True),
                ],
            ),
        ]
    }
    assert stored_task_handlers(handlers) == {
        "etl": [
            {"task_id": "a", "binding": "named", "params": None},
            {
                "task_id": "b",
                "binding": "positional",
                "params": [
                    {"name": None, "value_schema": {"type": "string"}, "exact_name": False},
                    {"name": "x", "value_schema": None, "exact_name": True},
                ],
            },
        ]
    }
    # Nothing was lost, so the runtime's answer is not kept separately.
    assert declared_task_handlers(handlers) is None


def test_stored_answers_are_normalized_to_design_b_values() -> None:
    """What Airflow's model accepts: binding positional|named, params name/value_schema/
    exact_name only. The SDK spellings of "by name" become named; nothing is kept beside."""
    handlers = {
        "etl": [
            TaskHandlerDeclaration(task_id="go", binding="named_or_whole", params=[]),
            TaskHandlerDeclaration(task_id="ts", binding="named_open", params=None),
        ]
    }
    assert stored_task_handlers(handlers) == {
        "etl": [
            {"task_id": "go", "binding": "named", "params": []},
            {"task_id": "ts", "binding": "named", "params": None},
        ]
    }
    assert declared_task_handlers(handlers) is None


def test_what_validation_would_miss_is_kept_in_the_operators_table() -> None:
    handlers = {
        "etl": [
            TaskHandlerDeclaration(task_id="future", binding="whole", params=[]),
            TaskHandlerDeclaration(
                task_id="old", binding="named", params=[TaskHandlerParam(name="x", required=False)]
            ),
        ]
    }
    # The unknown mode is left out of Airflow's row, Design A's required dropped ...
    assert stored_task_handlers(handlers) == {
        "etl": [
            {
                "task_id": "old",
                "binding": "named",
                "params": [{"name": "x", "value_schema": None, "exact_name": False}],
            }
        ]
    }
    # ... and the runtime's answer is kept as it was, for the fast path to validate the same.
    assert declared_task_handlers(handlers) == {
        "etl": [
            {"task_id": "future", "binding": "whole", "params": []},
            {
                "task_id": "old",
                "binding": "named",
                "params": [
                    {"name": "x", "value_schema": None, "exact_name": False, "required": False}
                ],
            },
        ]
    }


@pytest.mark.parametrize(
    "declaration",
    [
        TaskHandlerDeclaration(task_id="t\x00"),
        TaskHandlerDeclaration(
            task_id="t", params=[TaskHandlerParam(value_schema={"pattern": ["a", "b\x00"]})]
        ),
        TaskHandlerDeclaration(task_id="t", params=[TaskHandlerParam(name="n\x00")]),
    ],
)
def test_a_declaration_with_a_nul_character_is_refused(
    declaration: TaskHandlerDeclaration,
) -> None:
    artifact = TaskHandlerArtifact(
        bundle_name="b", relative_fileloc="x.jar", size_bytes=1, task_handlers={"d": [declaration]}
    )
    with pytest.raises(ValidationError) as caught:
        ArtifactRecord(artifact=artifact)
    assert caught.value.errors()[0]["msg"] == (
        "Value error, artifact 'x.jar' declares task handlers containing a NUL character, "
        "which the database cannot store"
    )

"""The pass key (reconcile/passkey.py): a stable digest of an unchanged pass's inputs, which a
new process compares with the one stored in the status. It must not depend on the process
(no ``hash()``), must change with every input it stands for, and must ignore the writer's
identity (every leader term has its own)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import Any

import pytest

from taskhandler_operator.airflow.serialized import DagStubs, StubTask, read_stubs
from taskhandler_operator.artifacts.listing import ListingProblem
from taskhandler_operator.artifacts.models import Candidate, Language
from taskhandler_operator.reconcile.models import BundleSpec
from taskhandler_operator.reconcile.passkey import KEY_VERSION, pass_key
from taskhandler_operator.records import BundleOwner

OWNER = BundleOwner(cluster_id="c", namespace="ns", name="orders", uid="u-1")
SPEC = BundleSpec(bundle_name="orders", language=Language.GO, queues=("go",), owner=OWNER)
DAG = DagStubs(
    dag_id="etl",
    bundle_name="dags",
    relative_fileloc="etl.py",
    dag_hash="h1",
    stubs=(StubTask(task_id="extract", queue="go"),),
)
INPUTS: dict[str, Any] = {
    "spec": SPEC,
    "revision": "sha256:abc",
    "candidates": (Candidate("extract", 10, "sha256:1"),),
    "problems": (),
    "dags": {"etl": DAG, "other": dataclasses.replace(DAG, dag_id="other")},
    "dag_ids": ("etl",),
    "rows": (3, 100, 3, 101),
}


def key(**changes: Any) -> str:
    return pass_key(**{**INPUTS, **changes})


def test_the_key_is_versioned_and_the_same_in_another_process() -> None:
    here = key()
    assert here.startswith(f"{KEY_VERSION}:") and len(here) == len(KEY_VERSION) + 65
    # Another interpreter, another string-hash seed: the same key.
    script = "from tests.unit.reconcile.test_passkey import key; print(key())"
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin"},
    ).stdout.strip()
    assert out == here


@pytest.mark.parametrize(
    "change",
    [
        {"spec": SPEC.model_copy(update={"queues": ("go", "more")})},
        {"spec": SPEC.model_copy(update={"owner": OWNER.model_copy(update={"uid": "u-2"})})},
        {
            "spec": SPEC.model_copy(
                update={"publish": SPEC.publish.model_copy(update={"approve_revision": "r2"})}
            )
        },
        {"revision": "sha256:abd"},
        {"candidates": (Candidate("extract", 11, "sha256:1"),)},
        {"candidates": (Candidate("extract", 10, "sha256:2"),)},
        {"candidates": (Candidate("extract", 10, "sha256:1", error="broken"),)},
        {"problems": (ListingProblem("x", "too big"),)},
        {"dags": {"etl": dataclasses.replace(DAG, dag_hash="h2")}},
        {"dags": {"etl": dataclasses.replace(DAG, stubs=())}},
        {"dags": {}},  # the Dag left the inventory
        {"dag_ids": ("etl", "other")},
        {"rows": (3, 100, 3, 102)},
    ],
    ids=lambda c: next(iter(c)),
)
def test_every_input_changes_the_key(change: dict[str, Any]) -> None:
    assert key(**change) != key()


def test_the_writer_identity_and_other_dags_are_not_inputs() -> None:
    other_term = SPEC.model_copy(
        update={"publish": SPEC.publish.model_copy(update={"operator": "pod-b/term-9"})}
    )
    assert key(spec=other_term) == key()
    # A Dag of the inventory that is not the bundle's (not in dag_ids) changes nothing.
    changed = {"etl": DAG, "other": dataclasses.replace(DAG, dag_id="other", dag_hash="x")}
    assert key(dags=changed) == key()


def test_a_dag_with_bindings_and_problems_keeps_its_key() -> None:
    # Pinned: a key that moves with the code (here, how the inventory's classes serialise) turns
    # every kept status stale after an upgrade, and every bundle makes a whole pass at once.
    document = {
        "__version": 3,
        "dag": {
            "dag_id": "d",
            "tasks": [
                {"__type": "operator", "__var": {"task_id": "a", "is_stub": True, "queue": "go"}},
                {
                    "__type": "operator",
                    "__var": {
                        "task_id": "b",
                        "is_stub": True,
                        "_is_mapped": True,
                        "_arg_bindings": [
                            {
                                "name": "x",
                                "kind": "xcom",
                                "task_id": "a",
                                "value_schema": {"type": "integer"},
                            },
                            {
                                "name": "y",
                                "kind": "literal",
                                "value": {"k": [1, 2.5, None]},
                                "from_default": True,
                            },
                        ],
                    },
                },
                {"__type": "operator", "__var": {"task_id": "c", "is_stub": "yes"}},
                {
                    "__type": "operator",
                    "__var": {"task_id": "d", "is_stub": True, "_arg_bindings": []},
                },
            ],
        },
    }
    dag = read_stubs(document, dag_id="d", bundle_name="b", relative_fileloc="d.py", dag_hash="h")
    assert [s.task_id for s in dag.stubs] == ["a", "b", "d"] and len(dag.problems) == 1
    assert key(dags={"d": dag}, dag_ids=("d", "zz")) == (
        "k1:fc0e6c36ca1390adbc93d59929defe173d554705949ef4f180d1b820a7a1bb1d"
    )
    assert key() == "k1:db9b88eb69ecb5d75fcfbb418aada8f422b10e640c1c9d2bd89bb29bcc572cd5"

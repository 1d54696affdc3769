"""DagBundle answers without a database (the integration test has Airflow write the rows)."""

from __future__ import annotations

import pytest

from taskhandler_operator.db.dag_bundle import DagBundleRecord, evaluate


@pytest.mark.parametrize(
    ("record", "revision", "reason", "status"),
    [
        (None, "c1", "UnknownDagBundle", "False"),
        (None, None, "UnknownDagBundle", "False"),
        (DagBundleRecord(name="b", active=False, version="c1"), "c1", "UnknownDagBundle", "False"),
        (DagBundleRecord(name="b", active=True, version=None), "c1", "VersionUnknown", "Unknown"),
        (DagBundleRecord(name="b", active=True, version="c1"), None, "VersionUnknown", "Unknown"),
        (DagBundleRecord(name="b", active=True, version="c1"), "c1", "InSync", "True"),
        # A row Airflow wrote before `active` existed, or left NULL, counts as known.
        (DagBundleRecord(name="b", active=None, version="c1"), "c1", "InSync", "True"),
        (DagBundleRecord(name="b", active=True, version="c2"), "c1", "Drift", "False"),
    ],
)
def test_each_state_has_its_reason(
    record: DagBundleRecord | None, revision: str | None, reason: str, status: str
) -> None:
    answer = evaluate("b", revision, record)
    assert (answer.reason, answer.status) == (reason, status)
    assert answer.condition() == {
        "type": "DagBundleInSync",
        "status": status,
        "reason": reason,
        "message": answer.message,
    }
    assert answer.warn is (reason == "Drift")
    assert answer.in_sync is (reason == "InSync")


def test_no_version_and_no_revision_never_reads_as_in_sync() -> None:
    answer = evaluate("b", None, DagBundleRecord(name="b", version=None))
    assert answer.reason == "VersionUnknown"
    assert answer.message.endswith("whether its workers see the probed revision cannot be told")

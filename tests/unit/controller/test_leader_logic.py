"""The pure parts of leader election: configuration rules, records, the expiry decision."""

from __future__ import annotations

from typing import Any

import pytest

from taskhandler_operator.controller.leader import (
    ElectionConfig,
    LeaseRecord,
    default_identity,
    held_by_other,
)


def test_defaults_are_client_gos() -> None:
    config = ElectionConfig(namespace="ops")
    assert (config.lease_duration, config.renew_deadline, config.retry_period) == (15, 10.0, 2.0)
    assert config.name == "taskhandler-operator"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lease_duration": 10, "renew_deadline": 10}, "must be longer than the renew deadline"),
        ({"renew_deadline": 2.0, "retry_period": 2.0}, r"longer than 1.2 x retry period"),
        ({"lease_duration": 15.5}, "whole seconds"),
        ({"retry_period": 0}, "must be positive"),
        ({"namespace": ""}, "needs a namespace"),
        ({"identity": ""}, "needs a namespace, a Lease name and an identity"),
    ],
)
def test_unsafe_timings_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ElectionConfig(**{"namespace": "ops", **kwargs})


def test_identity_is_pod_name_plus_random_suffix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "operator-7f9c-abcde")
    first, second = default_identity(), default_identity()
    assert first.startswith("operator-7f9c-abcde_") and second.startswith("operator-7f9c-abcde_")
    assert first != second  # a restarted pod with the same name is a new candidate
    assert default_identity("explicit").startswith("explicit_")


def test_record_from_a_lease() -> None:
    renew, acquire = "2026-11-30T12:00:00.000000Z", "2026-11-30T11:00:00.000000Z"
    lease = {
        "spec": {
            "holderIdentity": "pod-a_1",
            "leaseDurationSeconds": 15,
            "renewTime": renew,
            "acquireTime": acquire,
            "leaseTransitions": 3,
        }
    }
    record = LeaseRecord.of(lease)
    assert record == LeaseRecord("pod-a_1", 15, acquire, renew, 3)
    assert LeaseRecord.of({}) == LeaseRecord("", 0, None, None, 0)


def test_expiry_is_judged_from_our_observation() -> None:
    held = LeaseRecord("other", 15, None, None, 0)
    assert held_by_other(held, "me", observed_at=100.0, now=114.9)
    assert not held_by_other(held, "me", observed_at=100.0, now=115.0)


def test_a_released_or_own_lease_is_free_at_once() -> None:
    assert not held_by_other(LeaseRecord("", 1, None, None, 2), "me", 100.0, 100.0)
    assert not held_by_other(LeaseRecord("me", 15, None, None, 2), "me", 100.0, 100.0)

"""The TaskHandlerBundle spec model: defaults, aliases, and every refusal with its message."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from taskhandler_operator.artifacts.models import Language
from taskhandler_operator.kube.duration import parse_duration
from taskhandler_operator.kube.markers import quantity_value
from taskhandler_operator.kube.spec import DeletionPolicy, TaskHandlerBundleSpec
from tests.unit.kube.examples import INVALID_SPECS, bundle_body


def spec(**changes: Any) -> TaskHandlerBundleSpec:
    return TaskHandlerBundleSpec.model_validate(bundle_body(**changes)["spec"])


def test_minimal_spec_gets_the_documented_defaults() -> None:
    s = spec()
    assert s.bundle_name == "etl-bundle"
    assert s.language is Language.GO
    assert s.queues == ["go", "go-fast"]
    assert s.interval == "5m" and s.timeout == "2m" and s.suspend is False
    assert s.deletion_policy is DeletionPolicy.DELETE
    assert s.probe.timeout == "1m" and s.probe.parallelism == 4 and s.probe.image is None
    assert s.source.git is not None and s.source.git.ref == "main"


def test_camel_case_on_the_wire_snake_case_in_python() -> None:
    s = spec(deletionPolicy="Orphan", probe={"nodeSelector": {"pool": "probes"}})
    assert s.deletion_policy is DeletionPolicy.ORPHAN
    dumped = s.model_dump(by_alias=True, exclude_none=True)
    assert dumped["bundleName"] == "etl-bundle"
    assert dumped["deletionPolicy"] == "Orphan"
    assert dumped["probe"]["nodeSelector"] == {"pool": "probes"}
    # populate_by_name: Python callers may use field names.
    assert TaskHandlerBundleSpec.model_validate(s.model_dump()).bundle_name == "etl-bundle"


def test_unknown_field_is_refused() -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        spec(intervall="5m")


@pytest.mark.parametrize(
    ("what", "changes", "message"), INVALID_SPECS, ids=[c[0] for c in INVALID_SPECS]
)
def test_invalid_spec_is_refused_with_the_crd_message(
    what: str, changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        spec(**changes)
    assert message in str(caught.value), what


def test_duplicate_queues_are_refused() -> None:
    with pytest.raises(ValidationError, match="queues are listed twice: go"):
        spec(queues=["go", "java", "go"])


def test_no_queue_is_refused() -> None:
    with pytest.raises(ValidationError, match="at least 1 item"):
        spec(queues=[])


def test_request_above_limit_is_refused_naming_both() -> None:
    resources = {"requests": {"memory": "1Gi"}, "limits": {"memory": "512Mi"}}
    with pytest.raises(ValidationError, match=r"requests.memory \(1Gi\) is above limits.memory"):
        spec(probe={"resources": resources})


def test_quantities_accept_integers_and_suffixes() -> None:
    s = spec(probe={"resources": {"requests": {"cpu": 1, "memory": "256Mi"}}})
    assert s.probe.resources.requests == {"cpu": 1, "memory": "256Mi"}
    assert quantity_value("500m") == 0.5
    assert quantity_value("1Gi") == 2**30
    assert quantity_value(2) == 2.0
    assert quantity_value("1e3") == 1000.0
    with pytest.raises(ValueError, match="not a quantity"):
        quantity_value("1Xi")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("5m", 300), ("1h30m", 5400), ("1.5h", 5400), ("250ms", 0.25), ("2m0s", 120)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


# "0.0000001s" and "0.000000001m" are positive but shorter than a microsecond (timedelta's
# resolution): they would be an interval of zero.
@pytest.mark.parametrize(
    "text", ["", "5", "0s", "-5m", "5 m", "1d", "5M", "m", "0.0000001s", "0.000000001m"]
)
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="must be a positive duration"):
        parse_duration(text)


def test_source_kinds_each_validate() -> None:
    for source in (
        {"http": {"url": "https://h/x.tgz", "sha256": "b" * 64}},
        {"s3": {"bucket": "bkt", "endpoint": "http://127.0.0.1:9000"}},
        {"volume": {"path": "/data/bundles", "subPath": "etl"}},
    ):
        assert spec(source=source).source.model_dump(exclude_none=True)


# -- found by tests/fuzz (docs/fuzzing.md): an OverflowError escaped validation -----------------


@pytest.mark.parametrize("text", ["99999999999999999999h", "2562048h", "9999999999999s"])
def test_a_duration_longer_than_go_can_hold_is_refused(text: str) -> None:
    with pytest.raises(ValidationError, match=r"interval\n.*at most 2562047h"):
        spec(interval=text)
    assert parse_duration("2562047h") == timedelta(hours=2562047)


def test_an_integer_quantity_beyond_int64_is_refused() -> None:
    too_big = {"requests": {"memory": 2**63}, "limits": {"memory": 10**400}}
    with pytest.raises(ValidationError, match="must be a Kubernetes quantity") as caught:
        spec(probe={"resources": too_big})
    assert caught.value.error_count() == 2
    largest = {"requests": {"memory": 2**63 - 1}, "limits": {"memory": 2**63 - 1}}
    assert spec(probe={"resources": largest}).probe.resources.limits == {"memory": 2**63 - 1}

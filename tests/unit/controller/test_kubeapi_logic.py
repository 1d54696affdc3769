"""The pure parts of the API wrapper: error typing, merge patches, times, references."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from taskhandler_operator.controller.kubeapi import (
    BUNDLES,
    ApiRefused,
    ApiUnavailable,
    Conflict,
    CustomResource,
    NotFound,
    _cut,
    _reference,
    classify,
    merge_patch_to,
    micro_time,
)


def api_error(status: int, reason: str = "", message: str = "") -> ApiException:
    body = json.dumps({"kind": "Status", "message": message, "reason": reason, "code": status})
    return ApiException(status=status, reason="HTTP reason", body=body)


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (0, ApiUnavailable),
        (429, ApiUnavailable),
        (500, ApiUnavailable),
        (503, ApiUnavailable),
        (400, ApiRefused),
        (401, ApiRefused),
        (403, ApiRefused),
        (422, ApiRefused),
        (404, NotFound),
        (409, Conflict),
    ],
)
def test_status_codes_map_to_typed_errors(status: int, kind: type[Exception]) -> None:
    error = classify("read Job ns/x", api_error(status, "Reason", "the apiserver says no"))
    assert type(error) is kind
    assert str(error) == "read Job ns/x: the apiserver says no"
    assert error.status == status
    assert error.retryable is (kind in (ApiUnavailable, Conflict))


def test_already_exists_keeps_its_reason() -> None:
    error = classify("create Job ns/x", api_error(409, "AlreadyExists", 'jobs "x" already exists'))
    assert isinstance(error, Conflict) and error.reason == "AlreadyExists"


def test_a_non_json_body_falls_back_to_the_http_reason() -> None:
    error = classify("x", ApiException(status=502, reason="Bad Gateway", body="<html>proxy</html>"))
    assert isinstance(error, ApiUnavailable) and str(error) == "x: Bad Gateway"


@pytest.mark.parametrize(
    "exc",
    [
        urllib3.exceptions.MaxRetryError(None, "/x", "Connection refused"),  # type: ignore[arg-type]
        urllib3.exceptions.ReadTimeoutError(None, "/x", "read timed out"),  # type: ignore[arg-type]
        ConnectionResetError("reset by peer"),
    ],
)
def test_transport_failures_are_unavailable(exc: BaseException) -> None:
    error = classify("list Jobs", exc)
    assert isinstance(error, ApiUnavailable)
    assert str(error).startswith("list Jobs: apiserver unavailable: ")
    assert "\n" not in str(error)


def test_classify_refuses_a_bug() -> None:
    with pytest.raises(TypeError):
        classify("x", KeyError("not an API failure"))


@pytest.mark.parametrize(
    ("old", "new", "patch"),
    [
        ({"a": 1, "b": 2}, {"a": 1, "b": 3}, {"b": 3}),
        ({"a": 1, "gone": 2}, {"a": 1}, {"gone": None}),
        ({"c": {"x": 1, "y": 2}}, {"c": {"x": 1}}, {"c": {"y": None}}),
        ({"list": [1, 2]}, {"list": [1]}, {"list": [1]}),  # lists are replaced whole
        ({}, {"new": {"k": "v"}}, {"new": {"k": "v"}}),
        ({"c": {"x": 1}}, {"c": "scalar"}, {"c": "scalar"}),
        ({"same": 1}, {"same": 1}, {}),
    ],
)
def test_merge_patch_to(old: dict[str, Any], new: dict[str, Any], patch: dict[str, Any]) -> None:
    assert merge_patch_to(old, new) == patch
    assert apply_merge_patch(old, patch) == new


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386's reference algorithm, to check the patches above round-trip."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


def test_micro_time_always_has_six_fraction_digits() -> None:
    # The generated models drop a zero fraction, which the apiserver refuses for a MicroTime.
    assert micro_time(datetime(2026, 11, 30, 12, 0, 0, 0, tzinfo=UTC)) == (
        "2026-11-30T12:00:00.000000Z"
    )
    assert micro_time(datetime(2026, 11, 30, 12, 0, 0, 5, tzinfo=UTC)).endswith(".000005Z")


def test_custom_resource_paths() -> None:
    assert BUNDLES.path("ns", "b", "status") == (
        "/apis/langsdk.dev/v1alpha1/namespaces/ns/taskhandlerbundles/b/status"
    )
    assert CustomResource("g.io", "v1", "things", "Thing").path("ns") == (
        "/apis/g.io/v1/namespaces/ns/things"
    )
    with pytest.raises(ValueError, match="not a valid object or namespace name"):
        BUNDLES.path("ns", "../x")
    with pytest.raises(ValueError, match="not a valid object or namespace name"):
        BUNDLES.path("", "x")


def test_reference_from_a_body_and_from_a_reference() -> None:
    body = {
        "apiVersion": "langsdk.dev/v1alpha1",
        "kind": "TaskHandlerBundle",
        "metadata": {"namespace": "ns", "name": "b", "uid": "u-1", "labels": {"x": "y"}},
        "spec": {},
    }
    expected = {
        "apiVersion": "langsdk.dev/v1alpha1",
        "kind": "TaskHandlerBundle",
        "namespace": "ns",
        "name": "b",
        "uid": "u-1",
    }
    assert _reference(body) == expected
    assert _reference(expected) == expected
    with pytest.raises(ValueError, match="needs the object's kind, namespace"):
        _reference({"apiVersion": "v1", "metadata": {"name": "x"}})


def test_cut_respects_utf8_bytes() -> None:
    assert _cut("short", 1024) == "short"
    cut = _cut("é" * 1000, 1024)
    assert len(cut.encode()) <= 1024 and cut.endswith("…")

"""Fuzz the CR spec validation: ``TaskHandlerBundleSpec`` over documents the apiserver could
hand the operator, at the fuzzing budget.

Inputs: a valid spec (tests/unit/kube/examples.py) with fields at any depth replaced by hostile
values (huge and odd strings, quantities and durations at the edges of their grammars, numbers
of every kind, nested JSON), removed, or added; plus arbitrary JSON. Contract, as the controller
uses it (controller/bundle.py): ``model_validate`` returns a spec or raises pydantic's
``ValidationError``, whose first error gives the InvalidSpec condition's location and message; a
valid spec's durations parse and its quantities compare, and it round-trips through its wire
form; under 64 MiB per example.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from pydantic import ValidationError

from taskhandler_operator.kube.duration import parse_duration
from taskhandler_operator.kube.markers import quantity_value
from taskhandler_operator.kube.spec import TaskHandlerBundleSpec
from tests.fuzz.budget import FUZZ, bounded_memory
from tests.unit.kube.examples import SHA, bundle_body
from tests.unit.protocol.frame_inputs import json_values

pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(3600)]

BASE: dict[str, Any] = bundle_body(
    interval="30s",
    timeout="1m30s",
    suspend=False,
    deletionPolicy="Orphan",
    probe={
        "image": "probe:1",
        "timeout": "45s",
        "parallelism": 2,
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"cpu": 1, "memory": "1Gi"},
        },
        "nodeSelector": {"disk": "ssd"},
        "tolerations": [{"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}],
    },
)["spec"]
SOURCES = [
    {"git": {"url": "https://g/x.git", "ref": "main", "path": "a", "secretRef": {"name": "s"}}},
    {"http": {"url": "https://h/x.tgz", "sha256": SHA}},
    {"s3": {"bucket": "b", "prefix": "p/", "endpoint": "http://s3", "pathStyle": True}},
    {"volume": {"path": "/data", "subPath": "x"}},
]

EDGES: st.SearchStrategy[Any] = st.sampled_from(
    [
        None, True, 0, -1, 1, 33, 2**63 - 1, 2**63, -(2**63), 10**400, 1e308, float("inf"),
        float("-inf"), 0.5, "", " ", "0", "0s", "1ms", "0.0001ms", "1h1h1h", "9" * 40 + "h",
        "99999999999999999999h", "1.5h", "5 minutes", "1e999", "1e308", "-1", "1E", "1Ei",
        "9" * 64 + "Ei", "0.000000001m", "100m", "1Gi", "1.5Gi", "+1", "∞", "\x00", "\ud800",
        "x" * 300, "x" * 100_000, "a b", "-x", "é", [], {}, [None], ["go", "go"], ["x"] * 100,
        {"git": None}, {"git": {}, "http": {}},
    ]
)  # fmt: skip
VALUES = st.one_of(EDGES, json_values, st.integers(), st.floats(), st.text(max_size=64))


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _paths(child, (*prefix, index))
    return found


def _set(document: Any, path: tuple[Any, ...], value: Any, remove: bool) -> None:
    *parents, last = path
    for key in parents:
        document = document[key]
    if remove and isinstance(document, dict):
        document.pop(last, None)
    else:
        # A copy: sampled values are shared objects, and the document is edited further.
        document[last] = copy.deepcopy(value)


# Values in each scalar field's own grammar, with numbers of any size: what passes the pattern
# and must still be refused or handled further in (a duration timedelta cannot hold, a
# quantity a float cannot hold).
DURATIONS = st.from_regex(r"([0-9]{1,22}(\.[0-9]{1,12})?(ms|s|m|h)){1,3}", fullmatch=True)
QUANTITIES = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([2**63 - 1, 2**63, 10**400]),
    st.from_regex(r"[0-9]{1,40}(\.[0-9]{0,10})?([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]{1,4})?",
                  fullmatch=True),
)  # fmt: skip
FIELDS: list[tuple[tuple[str, ...], st.SearchStrategy[Any]]] = [
    (("interval",), DURATIONS),
    (("timeout",), DURATIONS),
    (("probe", "timeout"), DURATIONS),
    (("probe", "parallelism"), st.integers(-(2**70), 2**70)),
    (("queues",), st.lists(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,300}", fullmatch=True))),
    (("bundleName",), st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,300}", fullmatch=True)),
]


@st.composite
def spec_documents(draw: st.DrawFn) -> Any:
    document = copy.deepcopy(BASE)
    document["source"] = copy.deepcopy(draw(st.sampled_from(SOURCES)))
    for path, values in FIELDS:
        if draw(st.integers(0, 3)) == 0:
            _set(document, path, draw(values), remove=False)
    if draw(st.integers(0, 3)) == 0:  # one resource with a drawn request and limit
        name = draw(st.sampled_from(["cpu", "memory", "ephemeral-storage"]))
        resources = document["probe"]["resources"]
        resources["requests"][name], resources["limits"][name] = draw(QUANTITIES), draw(QUANTITIES)
    for _ in range(draw(st.integers(0, 3))):
        paths = _paths(document)
        if not paths or not isinstance(document, dict):
            break
        path = draw(st.sampled_from(paths))
        choice = draw(st.integers(0, 5))
        if choice == 0:  # an unknown key next to a known one
            path = (*path[:-1], draw(st.sampled_from(["extra", "Queues", "bundle_name", ""])))
            try:
                _set(document, path, draw(VALUES), remove=False)
            except (TypeError, IndexError, KeyError):
                continue
        else:
            try:
                _set(document, path, draw(VALUES), remove=choice == 1)
            except (TypeError, IndexError, KeyError):
                continue
    return document


# Mostly mutated specs (each of which reaches a different check), sometimes any JSON at all.
DOCUMENTS = st.one_of(spec_documents(), spec_documents(), spec_documents(), json_values)


@FUZZ
@given(document=DOCUMENTS)
def test_a_spec_is_valid_or_a_validation_error(document: Any) -> None:
    with bounded_memory():
        try:
            spec = TaskHandlerBundleSpec.model_validate(document)
        except ValidationError as exc:
            # What the controller turns into the InvalidSpec condition.
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            assert isinstance(first.get("msg"), str) and first["msg"]
            assert isinstance(where, str) and str(exc)
            event(f"invalid: {first['type']}")
            return
        event("valid")
        for duration in (spec.interval, spec.timeout, spec.probe.timeout):
            assert parse_duration(duration).total_seconds() > 0
        resources = spec.probe.resources
        for name in resources.requests.keys() & resources.limits.keys():
            assert quantity_value(resources.requests[name]) <= quantity_value(
                resources.limits[name]
            )
        wire = spec.model_dump(by_alias=True, mode="json")
        assert TaskHandlerBundleSpec.model_validate(wire) == spec

"""The generated CRD: committed file in sync, structural, described, with its rules and columns."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, Field

from taskhandler_operator.cli import main
from taskhandler_operator.kube import names
from taskhandler_operator.kube.crd import (
    CrdSchemaError,
    crd_yaml,
    custom_resource_definition,
    structural_schema,
)

REPO = Path(__file__).resolve().parents[3]
COMMITTED = REPO / names.CRD_FILE


def version() -> dict[str, Any]:
    versions = custom_resource_definition()["spec"]["versions"]
    assert len(versions) == 1
    result: dict[str, Any] = versions[0]
    return result


def root() -> dict[str, Any]:
    result: dict[str, Any] = version()["schema"]["openAPIV3Schema"]
    return result


def nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, prop in schema.get("properties", {}).items():
        yield from nodes(prop, f"{path}.{name}")
    if "items" in schema:
        yield from nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from nodes(schema["additionalProperties"], f"{path}{{}}")


def node(path: str) -> dict[str, Any]:
    found = dict(nodes(root()))
    return found[path]


def test_committed_yaml_matches_the_models() -> None:
    assert COMMITTED.read_text(encoding="utf-8") == crd_yaml(), (
        f"{names.CRD_FILE} drifted from kube/spec.py and kube/status.py; regenerate it: "
        f"taskhandler-operator crd > {names.CRD_FILE}"
    )


def test_identity_names_and_scope() -> None:
    crd = custom_resource_definition()
    assert crd["metadata"]["name"] == "taskhandlerbundles.langsdk.dev"
    spec = crd["spec"]
    assert spec["group"] == "langsdk.dev" and spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "TaskHandlerBundle",
        "listKind": "TaskHandlerBundleList",
        "plural": "taskhandlerbundles",
        "singular": "taskhandlerbundle",
        "shortNames": ["thb"],
        "categories": ["langsdk"],
    }
    v = version()
    assert v["name"] == "v1alpha1" and v["served"] and v["storage"]
    assert v["subresources"] == {"status": {}}


def test_schema_is_structural() -> None:
    for path, schema in nodes(root()):
        for word in ("$ref", "anyOf", "oneOf", "allOf", "not", "title", "const", "$defs"):
            assert word not in schema, f"{path or '<root>'} has {word}"
        if path != ".metadata":
            assert "type" in schema or schema.get("x-kubernetes-int-or-string"), path
        if "additionalProperties" in schema:
            assert "properties" not in schema and isinstance(
                schema["additionalProperties"], dict
            ), path


def test_every_field_has_a_description() -> None:
    missing = [
        f"{path}.{name}"
        for path, schema in nodes(root())
        for name, prop in schema.get("properties", {}).items()
        if not prop.get("description") and f"{path}.{name}" != ".metadata"
    ]
    assert missing == []


def test_defaults_are_in_the_schema() -> None:
    assert node(".spec.interval")["default"] == "5m"
    assert node(".spec.timeout")["default"] == "2m"
    assert node(".spec.suspend")["default"] is False
    assert node(".spec.deletionPolicy")["default"] == "Delete"
    assert node(".spec.probe")["default"] == {}
    assert node(".spec.probe.parallelism")["default"] == 4
    assert node(".spec.source.git.ref")["default"] == "main"
    # An object with a required field gets no default: leaving it out must stay "not set".
    assert "default" not in node(".spec.source.git")
    assert "default" not in node(".spec.source.git.secretRef")


def rules(path: str) -> list[dict[str, str]]:
    result: list[dict[str, str]] = node(path).get("x-kubernetes-validations", [])
    return result


def test_cel_rules_carry_messages() -> None:
    assert any("oldSelf" in r["rule"] for r in rules(".spec.bundleName"))
    assert rules(".spec.source")[0]["message"].startswith("source must name exactly one of")
    assert "matches(" in rules(".spec.queues[]")[0]["rule"]
    for duration in (".spec.interval", ".spec.timeout", ".spec.probe.timeout"):
        assert "duration(self)" in rules(duration)[0]["rule"]
    assert rules(".spec.probe.parallelism")[0]["rule"] == "self >= 1 && self <= 32"
    # One message per mistake: a rule's check is not repeated as an OpenAPI keyword.
    for path in (".spec.queues[]", ".spec.interval", ".spec.probe.parallelism"):
        assert not {"pattern", "minimum", "maximum"} & node(path).keys(), path
    assert node(".spec.queues")["x-kubernetes-list-type"] == "set"
    name_rule = root()["x-kubernetes-validations"][0]
    assert name_rule["rule"] == "size(self.metadata.name) <= 63"


def test_quantities_are_int_or_string_and_maps_have_value_schemas() -> None:
    quantity = node(".spec.probe.resources.limits{}")
    assert quantity["x-kubernetes-int-or-string"] is True and "type" not in quantity
    assert node(".spec.probe.nodeSelector")["additionalProperties"] == {"type": "string"}


def test_status_conditions_are_a_map_list_by_type() -> None:
    conditions = node(".status.conditions")
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert {"type", "status", "reason", "lastTransitionTime"} <= set(
        conditions["items"]["required"]
    )


def test_printer_columns() -> None:
    columns = {c["name"]: c for c in version()["additionalPrinterColumns"]}
    assert list(columns) == [
        "Language",
        "Queues",
        "Ready",
        "Revision",
        "Handlers",
        "Bindings",
        "Age",
        "Suspended",
        "Full Revision",
        "Reason",
        "Message",
    ]
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Handlers"]["jsonPath"] == ".status.counts.handlers"
    # Status strings the operator writes: no JSON list, no 40-hex commit in the table.
    assert columns["Queues"]["jsonPath"] == ".status.queues"
    assert columns["Revision"]["jsonPath"] == ".status.shortRevision"
    assert columns["Full Revision"]["jsonPath"] == ".status.revision"
    assert (columns["Suspended"]["jsonPath"], columns["Suspended"]["type"]) == (
        ".spec.suspend",
        "boolean",
    )
    assert columns["Age"]["type"] == "date"
    wide = [name for name, c in columns.items() if c.get("priority") == 1]
    assert wide == ["Suspended", "Full Revision", "Reason", "Message"]


def test_yaml_has_the_generated_header_and_parses_back() -> None:
    text = crd_yaml()
    assert text.startswith("# Generated by `taskhandler-operator crd`")
    assert yaml.safe_load(text) == custom_resource_definition()


class _TwoTypes(BaseModel):
    value: int | str = Field(description="either")


class _Undescribed(BaseModel):
    value: int


def test_a_union_of_types_is_refused_not_rendered_wrongly() -> None:
    with pytest.raises(CrdSchemaError, match=r"\.value: anyOf of 2 schemas"):
        structural_schema(_TwoTypes.model_json_schema())


def test_a_field_without_description_is_refused() -> None:
    with pytest.raises(CrdSchemaError, match=r"\.value: no description"):
        structural_schema(_Undescribed.model_json_schema())


def test_an_unknown_keyword_is_refused() -> None:
    with pytest.raises(CrdSchemaError, match="unsupported JSON Schema keyword 'if'"):
        structural_schema({"type": "object", "if": {}})


def test_crd_command_prints_the_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd"]) == 0
    assert capsys.readouterr().out == crd_yaml()


def test_crd_check_passes_on_the_committed_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd", "--check", "--file", str(COMMITTED)]) == 0
    assert "matches the models" in capsys.readouterr().out


def test_crd_check_fails_on_drift_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "crd.yaml"
    stale.write_text(crd_yaml().replace("default: 5m", "default: 10m"))
    assert main(["crd", "--check", "--file", str(stale)]) == 1
    assert capsys.readouterr().err == (
        f"error: {stale} does not match the models; regenerate it: "
        f"taskhandler-operator crd > {stale}\n"
    )


def test_crd_check_of_a_missing_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.yaml"
    assert main(["crd", "--check", "--file", str(missing)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {missing}: cannot be opened (No such file or directory);")
    assert err.count("\n") == 1


@pytest.mark.parametrize("path", ["/dev/zero", "fifo", "folder"])
def test_crd_check_of_a_device_fifo_or_folder_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], path: str
) -> None:
    import os

    target = Path(path) if path.startswith("/") else tmp_path / path
    if path == "fifo":
        os.mkfifo(target)
    elif path == "folder":
        target.mkdir()
    assert main(["crd", "--check", "--file", str(target)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {target}: is ") and err.count("\n") == 1, err


def test_short_revisions_for_each_source_kind() -> None:
    from taskhandler_operator.kube.status import short_revision

    commit, digest = "0123456789abcdef" * 2 + "01234567", "a1b2c3d4" * 8
    assert short_revision(f"{commit}-0a1b2c3d4e5f", f"main@sha1:{commit}") == "main@sha1:01234567"
    assert short_revision(commit, f"v1.2.0@sha1:{commit}") == "v1.2.0@sha1:01234567"
    assert short_revision(commit, f"sha1:{commit}") == "sha1:01234567"  # a commit ref
    # http (the pinned sha256), s3 (listing digest), volume (content digest)
    assert short_revision(f"{digest}-0a1b2c3d4e5f", f"sha256:{digest}") == "sha256:a1b2c3d4"
    assert short_revision(digest) == "a1b2c3d4"  # only the id known

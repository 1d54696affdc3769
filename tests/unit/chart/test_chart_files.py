"""The chart's generated and checked files: nothing in the chart may drift from its source.

* files/crd.yaml is byte-for-byte what kube/crd.py generates (and so crds/'s file);
* files/rbac-rules.yaml is what kube/rbac.py's rules render to (`taskhandler-operator rbac`);
* README.md's values table is what values.yaml's comments say, every value documented;
* values.schema.json knows every key of values.yaml and closes every object it describes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from taskhandler_operator.cli import main
from taskhandler_operator.kube import names
from taskhandler_operator.kube.crd import crd_yaml
from taskhandler_operator.kube.rbac import (
    LEADER_ELECTION_RULES,
    RULES_FILE,
    WATCH_RULES,
    rules_yaml,
)
from tests.unit.chart.values_doc import (
    CHART,
    documented_keys,
    expected_readme,
    undocumented_leaves,
)

REPO = CHART.parents[1]
VALUES_TEXT = (CHART / "values.yaml").read_text(encoding="utf-8")
VALUES = yaml.safe_load(VALUES_TEXT)
SCHEMA = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))


def test_the_charts_crd_is_the_generated_crd() -> None:
    copy = (CHART / "files" / "crd.yaml").read_text(encoding="utf-8")
    assert copy == (REPO / names.CRD_FILE).read_text(encoding="utf-8") == crd_yaml(), (
        "charts/taskhandler-operator/files/crd.yaml differs from the models; regenerate it: "
        "taskhandler-operator crd > charts/taskhandler-operator/files/crd.yaml"
    )


def test_the_charts_rbac_rules_are_kube_rbac() -> None:
    assert (REPO / RULES_FILE).read_text(encoding="utf-8") == rules_yaml(), (
        f"{RULES_FILE} differs from kube/rbac.py; regenerate it: "
        f"taskhandler-operator rbac > {RULES_FILE}"
    )
    parsed = yaml.safe_load(rules_yaml())
    assert parsed == {
        "watch": [r.to_k8s() for r in WATCH_RULES],
        "leaderElection": [r.to_k8s() for r in LEADER_ELECTION_RULES],
    }


def test_rbac_check_passes_on_the_committed_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rbac", "--check", "--file", str(REPO / RULES_FILE)]) == 0
    assert "matches the rules in kube/rbac.py" in capsys.readouterr().out


def test_rbac_check_fails_on_drift_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "rules.yaml"
    stale.write_text(rules_yaml().replace('"get", "list", "watch", "patch"', '"*"'))
    assert main(["rbac", "--check", "--file", str(stale)]) == 1
    assert capsys.readouterr().err == (
        f"error: {stale} does not match the rules in kube/rbac.py; regenerate it: "
        f"taskhandler-operator rbac > {stale}\n"
    )


def test_rbac_prints_the_rules(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rbac"]) == 0
    assert capsys.readouterr().out == rules_yaml()


def test_every_value_is_documented() -> None:
    docs = documented_keys(VALUES_TEXT)
    assert undocumented_leaves(VALUES, docs) == []
    assert all(meaning for meaning in docs.values())


def test_the_readme_lists_every_value_with_its_default() -> None:
    readme = (CHART / "README.md").read_text(encoding="utf-8")
    assert readme == expected_readme(readme, VALUES_TEXT), (
        "charts/taskhandler-operator/README.md's values table differs from values.yaml; "
        "rewrite it: python -m tests.unit.chart.values_doc"
    )
    assert '| `database.existingSecret` | `""` |' in readme


def _schema_keys(schema: dict[str, Any], prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}.{key}" if prefix else key
        keys.add(path)
        keys |= _schema_keys(sub, path)
    return keys


def _value_keys(values: Any, prefix: str = "") -> set[str]:
    keys: set[str] = set()
    if isinstance(values, dict):
        for key, child in values.items():
            path = f"{prefix}.{key}" if prefix else key
            keys.add(path)
            keys |= _value_keys(child, path)
    return keys


def test_the_schema_describes_exactly_the_values() -> None:
    schema_keys = _schema_keys(SCHEMA)
    value_keys = _value_keys(VALUES)
    # resources' request/limit names and the security contexts' Kubernetes fields are allowed,
    # not required: drop the optional ones.
    missing = value_keys - schema_keys
    assert missing == set(), f"values without a schema: {sorted(missing)}"
    optional = ("podSecurityContext.", "securityContext.")
    extra = {
        k
        for k in schema_keys - value_keys
        if not k.endswith(("cpu", "ephemeral-storage")) and not k.startswith(optional)
    }
    assert extra == set(), f"schema keys without a value: {sorted(extra)}"


def _objects(schema: Any, path: str = "$") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(schema, dict):
        if "properties" in schema:
            found.append((path, schema))
        for key, sub in schema.items():
            found += _objects(sub, f"{path}.{key}")
    elif isinstance(schema, list):
        for i, sub in enumerate(schema):
            found += _objects(sub, f"{path}[{i}]")
    return found


def test_every_described_object_refuses_unknown_keys() -> None:
    objects = [(p, o) for p, o in _objects(SCHEMA) if ".if" not in p and ".then" not in p]
    assert len(objects) > 15
    open_ = [p for p, o in objects if o.get("additionalProperties") is not False]
    # extraEnv items are Kubernetes EnvVars (name + value or valueFrom), extraVolumes items
    # Volumes and extraVolumeMounts items VolumeMounts: their many fields are left to the
    # apiserver.
    assert open_ == [
        "$.properties.extraEnv.items",
        "$.properties.extraVolumes.items",
        "$.properties.extraVolumeMounts.items",
    ]

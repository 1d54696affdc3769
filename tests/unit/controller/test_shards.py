"""Shards (docs/operator.md, "Shards"): the shard setting, the bundle selector, the Lease."""

from __future__ import annotations

import argparse
import copy
import os
from typing import Any, cast

import kopf
import pytest
from kopf._cogs.structs.references import Resource  # the resource kopf's watches are made for

from taskhandler_operator.controller.commands import default_lease_name, register
from taskhandler_operator.controller.switchboard import bundle_selector, configure
from taskhandler_operator.kube import names
from taskhandler_operator.settings import SettingsError, load_settings

BUNDLES = Resource(names.GROUP, names.VERSION, names.PLURAL, kind=names.KIND, namespaced=True)
JOBS = Resource("batch", "v1", "jobs", kind="Job", namespaced=True)
PODS = Resource("", "v1", "pods", kind="Pod", namespaced=True)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("THOP_") and name != "THOP_CACHE":
            monkeypatch.delenv(name)


def test_the_default_shard_takes_the_bundles_without_a_shard_label() -> None:
    assert load_settings().shard == ""
    assert load_settings().shard_name == "default"
    assert bundle_selector("") == "!langsdk.dev/shard"


def test_a_named_shard_takes_its_labelled_bundles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THOP_SHARD", "team-a")
    settings = load_settings()
    assert (settings.shard, settings.shard_name) == ("team-a", "team-a")
    assert bundle_selector(settings.shard) == "langsdk.dev/shard=team-a"


@pytest.mark.parametrize("shard", ["", "b"])
def test_kopf_asks_the_apiserver_for_the_shards_bundles_and_every_probe_job(shard: str) -> None:
    # The selector must reach the resource kopf watches (its key is matched against the
    # resource's group, version and plural): what kopf's watch and list send as labelSelector.
    settings = kopf.OperatorSettings()
    configure(settings, shard)
    assert settings.watching.label_selectors.collect(BUNDLES) == [bundle_selector(shard)]
    # Probe Jobs and pods are never filtered by shard: a shard adopts another shard's Jobs.
    assert settings.watching.label_selectors.collect(JOBS) == [
        "app.kubernetes.io/managed-by=taskhandler-operator"
    ]
    assert settings.watching.label_selectors.collect(PODS) == [
        "app.kubernetes.io/managed-by=taskhandler-operator,app.kubernetes.io/name=taskhandler-probe"
    ]


def _essence_changed(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether kopf, configured as the operator configures it, sees a change from ``before``
    (whose essence it stored as it does after a handler) to ``after``."""
    settings = kopf.OperatorSettings()
    configure(settings)
    storage = settings.persistence.diffbase_storage
    patch = kopf.Patch()
    old = kopf.Body(cast("kopf.RawBody", before))
    storage.store(body=old, patch=patch, essence=storage.build(body=old))
    stored = copy.deepcopy(after)
    stored["metadata"]["annotations"].update(patch["metadata"]["annotations"])
    new = kopf.Body(cast("kopf.RawBody", stored))
    return storage.fetch(body=new) != storage.build(body=new)


def _bundle(labels: dict[str, str], spec: dict[str, Any], requested: str = "t0") -> dict[str, Any]:
    annotations = {"langsdk.dev/reconcile-requested-at": requested}
    meta = {"name": "b1", "namespace": "ns", "labels": labels, "annotations": annotations}
    return {
        "apiVersion": "langsdk.dev/v1alpha1",
        "kind": names.KIND,
        "metadata": meta,
        "spec": spec,
    }


def test_moving_a_bundle_to_another_shard_is_not_a_change_for_kopf() -> None:
    # A relabel must cost the new shard no update handler and no diff-base write per bundle.
    spec = {"interval": "60s"}
    unlabelled = _bundle({"team": "x"}, spec)
    labelled = _bundle({"team": "x", names.LABEL_SHARD: "b"}, spec)
    assert not _essence_changed(unlabelled, labelled)
    assert not _essence_changed(labelled, unlabelled)
    assert not _essence_changed(labelled, _bundle({"team": "x", names.LABEL_SHARD: "c"}, spec))
    # Everything else still is: the spec, another label, the reconcile-request annotation.
    assert _essence_changed(labelled, _bundle({"team": "x", names.LABEL_SHARD: "b"}, {}))
    assert _essence_changed(unlabelled, _bundle({"team": "y"}, spec))
    assert _essence_changed(unlabelled, _bundle({"team": "x"}, spec, requested="t1"))


@pytest.mark.parametrize(
    ("shard", "why"),
    [
        ("default", "'default' is reserved: the default shard"),
        ("Team-A", "'Team-A' is not a shard name"),
        ("-a", "'-a' is not a shard name"),
        ("a-", "'a-' is not a shard name"),
        ("a.b", "'a.b' is not a shard name"),
        ("a" * 41, "is not a shard name"),
    ],
)
def test_a_bad_shard_is_a_clear_settings_error(
    monkeypatch: pytest.MonkeyPatch, shard: str, why: str
) -> None:
    monkeypatch.setenv("THOP_SHARD", shard)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith("invalid setting THOP_SHARD (--shard): ")
    assert why in message and "\n" not in message


def test_the_longest_shard_name_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THOP_SHARD", "a" * 40)
    assert load_settings().shard == "a" * 40


def test_each_shard_has_its_own_lease() -> None:
    assert default_lease_name("") == "taskhandler-operator"
    assert default_lease_name("b") == "taskhandler-operator-b"


def _run_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["run", *argv])


def test_the_lease_name_flag_defaults_to_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    # None (no flag, no variable) lets run() pick the shard's default.
    assert _run_args().lease_name is None
    monkeypatch.setenv("THOP_LEASE_NAME", "mine")
    assert _run_args().lease_name == "mine"
    assert _run_args("--lease-name", "flag").lease_name == "flag"

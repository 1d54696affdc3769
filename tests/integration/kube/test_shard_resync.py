"""The handover's safety nets on the real kube-apiserver (docs/operator.md, "Shards"):

* the resync releases the hold of a bundle that left the shard although its DELETED event was
  never delivered (the reconciler is stopped as on DELETED), over the real paginated, label
  selected, metadata-only LIST, per namespace and cluster-wide, for a named and the default
  shard; a failed LIST releases nothing;
* the DELETED event the apiserver's filtered watch sends for a relabelled bundle carries no
  ``deletionTimestamp`` (the object as it was), the final one of a deleted bundle with our
  finalizer does, and one deleted without a finalizer is told apart by a read: only a deletion
  wakes the shard's other bundles.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import pytest
from kubernetes import client as k8s_client
from kubernetes import watch as k8s_watch
from kubernetes.client import ApiClient, Configuration

from taskhandler_devenv.kubecluster.procs import free_port
from taskhandler_operator.controller.holds import Holds, run_held
from taskhandler_operator.controller.kubeapi import KubeApi
from taskhandler_operator.controller.shardsync import (
    bundle_deleted,
    bundle_selector,
    resync_holds,
)
from taskhandler_operator.kube import names
from tests.unit.kube.examples import bundle_body

pytestmark = [pytest.mark.kube, pytest.mark.timeout(120), pytest.mark.usefixtures("thb_crd")]

FINALIZER = f"{names.GROUP}/finalizer"


@pytest.fixture
async def kubeapi(kube_api: ApiClient) -> AsyncIterator[KubeApi]:
    api = KubeApi(kube_api)
    try:
        yield api
    finally:
        await api.aclose()


def create(api: ApiClient, ns: str, name: str, shard: str | None, finalizer: bool = False) -> None:
    body = bundle_body(name, ns, bundleName=name)
    if shard is not None:
        body["metadata"]["labels"] = {names.LABEL_SHARD: shard}
    if finalizer:
        body["metadata"]["finalizers"] = [FINALIZER]
    k8s_client.CustomObjectsApi(api).create_namespaced_custom_object(
        names.GROUP, names.VERSION, ns, names.PLURAL, body
    )


def patch(api: ApiClient, ns: str, name: str, body: dict[str, Any]) -> None:
    k8s_client.CustomObjectsApi(api).patch_namespaced_custom_object(
        names.GROUP, names.VERSION, ns, names.PLURAL, name, body
    )


async def test_resync_releases_a_bundle_whose_deleted_was_missed(
    kube_api: ApiClient, kubeapi: KubeApi, kube_namespace: str
) -> None:
    ns = kube_namespace
    create(kube_api, ns, "kept", "s1")
    create(kube_api, ns, "moved", "s1")
    create(kube_api, ns, "plain", None)
    holds = Holds()
    holds.take(ns, "kept")
    moved = holds.take(ns, "moved")
    stopped = asyncio.Event()

    async def reconciler() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            stopped.set()

    running = asyncio.create_task(run_held(holds, moved, reconciler()))
    await asyncio.sleep(0)
    # Relabelled to shard s2: this test never delivers the DELETED the watch would send.
    patch(kube_api, ns, "moved", {"metadata": {"labels": {names.LABEL_SHARD: "s2"}}})

    assert await resync_holds(kubeapi, holds, "s1", (ns,), "s1") == [(ns, "moved")]
    await asyncio.wait_for(running, 10)
    assert stopped.is_set() and holds.holds(ns, "kept") and not holds.holds(ns, "moved")
    # Nothing more to release; the cluster-wide LIST (no THOP_NAMESPACES) sees "kept" too.
    assert await resync_holds(kubeapi, holds, "s1", (), "s1") == []
    assert holds.holds(ns, "kept")

    # The default shard lists the bundles without the label (!langsdk.dev/shard).
    default = Holds()
    default.take(ns, "plain")
    default.take(ns, "kept")  # as if it had been the default shard's before its relabel
    assert bundle_selector("") == f"!{names.LABEL_SHARD}"
    assert await resync_holds(kubeapi, default, "", (ns,), "default") == [(ns, "kept")]
    assert default.holds(ns, "plain")


async def test_resync_spares_holds_taken_while_it_lists(
    kube_api: ApiClient, kubeapi: KubeApi, kube_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = kube_namespace
    holds = Holds()
    real_list = kubeapi.list_bundle_keys

    async def slow_list(namespace: str | None, selector: str) -> set[tuple[str, str]]:
        listed = await real_list(namespace, selector)
        # The bundle joins the shard after the LIST's snapshot, and its reconciler starts
        # before the LIST answers.
        create(kube_api, ns, "late", "s1")
        holds.take(ns, "late")
        return listed

    monkeypatch.setattr(kubeapi, "list_bundle_keys", slow_list)
    assert await resync_holds(kubeapi, holds, "s1", (ns,), "s1") == []
    assert holds.holds(ns, "late")


async def test_a_failed_resync_releases_nothing() -> None:
    config = Configuration()
    config.host = f"https://127.0.0.1:{free_port()}"
    config.retries = False
    api = ApiClient(config)
    kubeapi = KubeApi(api, request_timeout=5)
    holds = Holds()
    holds.take("ns", "b")
    try:
        assert await resync_holds(kubeapi, holds, "s1", ("ns",), "s1") == []
        assert holds.holds("ns", "b")
    finally:
        await kubeapi.aclose()
        api.close()


async def test_only_a_deletion_is_told_deleted(
    kube_api: ApiClient, kubeapi: KubeApi, kube_namespace: str
) -> None:
    ns = kube_namespace
    create(kube_api, ns, "relabelled", "w1", finalizer=True)
    create(kube_api, ns, "deleted", "w1", finalizer=True)
    create(kube_api, ns, "unfinalized", "w1")
    custom = k8s_client.CustomObjectsApi(kube_api)
    selector = bundle_selector("w1")
    listing = cast(
        dict[str, Any],
        custom.list_namespaced_custom_object(
            names.GROUP, names.VERSION, ns, names.PLURAL, label_selector=selector
        ),
    )
    since = listing["metadata"]["resourceVersion"]

    patch(kube_api, ns, "relabelled", {"metadata": {"labels": {names.LABEL_SHARD: "w2"}}})
    custom.delete_namespaced_custom_object(names.GROUP, names.VERSION, ns, names.PLURAL, "deleted")
    patch(kube_api, ns, "deleted", {"metadata": {"finalizers": None}})  # as kopf does at the end
    custom.delete_namespaced_custom_object(
        names.GROUP, names.VERSION, ns, names.PLURAL, "unfinalized"
    )

    # The shard's filtered watch, as kopf runs it (from the listing's resourceVersion).
    deleted: dict[str, dict[str, Any]] = {}
    stream: Iterator[dict[str, Any]] = k8s_watch.Watch().stream(
        custom.list_namespaced_custom_object,
        names.GROUP,
        names.VERSION,
        ns,
        names.PLURAL,
        label_selector=selector,
        resource_version=since,
        timeout_seconds=10,
    )
    for event in stream:
        if event["type"] == "DELETED":
            deleted[event["object"]["metadata"]["name"]] = event["object"]["metadata"]
        if len(deleted) == 3:
            break
    assert sorted(deleted) == ["deleted", "relabelled", "unfinalized"]

    relabelled = deleted["relabelled"]
    assert "deletionTimestamp" not in relabelled
    assert relabelled["labels"][names.LABEL_SHARD] == "w1"  # the object as it was
    assert deleted["deleted"].get("deletionTimestamp")
    assert "deletionTimestamp" not in deleted["unfinalized"]

    assert not await bundle_deleted(kubeapi, relabelled)
    assert await bundle_deleted(kubeapi, deleted["deleted"])
    assert await bundle_deleted(kubeapi, deleted["unfinalized"])  # a read: 404

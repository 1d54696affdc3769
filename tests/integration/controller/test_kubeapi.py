"""Every call of the async API wrapper against the real kube-apiserver (docs/operator.md,
"Kubernetes API calls").

The bundle status patch runs on a throwaway CRD made here, with a status subresource and a
structural schema, under a unique group so it cannot collide with the product's own CRD.
"""

from __future__ import annotations

import asyncio
import base64
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s_client
from kubernetes.client import ApiClient, Configuration

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.kubecluster.procs import free_port
from taskhandler_operator.controller.kubeapi import (
    ApiRefused,
    ApiUnavailable,
    Conflict,
    CustomResource,
    KubeApi,
    NotFound,
    micro_time,
)
from tests.integration.controller.conftest import eventually

pytestmark = [pytest.mark.kube, pytest.mark.timeout(180)]

Obj = dict[str, Any]


# --- a throwaway CRD with a status subresource -----------------------------------------------


@pytest.fixture(scope="module")
def thing(kube_cluster: KubeCluster) -> Iterator[CustomResource]:
    from kubernetes import config as k8s_config

    api = k8s_config.new_client_from_config(config_file=str(kube_cluster.kubeconfig))
    ext = k8s_client.ApiextensionsV1Api(api)
    group = f"kubeapi-{uuid.uuid4().hex[:8]}.test.langsdk.dev"
    status_schema = {
        "type": "object",
        "properties": {
            "phase": {"type": "string"},
            "observedGeneration": {"type": "integer"},
            "message": {"type": "string"},
            "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
            "conditions": {
                "type": "array",
                "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
        },
    }
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"things.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "things", "singular": "thing", "kind": "Thing"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                },
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }
    ext.create_custom_resource_definition(k8s_client.V1CustomResourceDefinition.model_validate(crd))
    try:
        yield CustomResource(group, "v1", "things", "Thing")
    finally:
        ext.delete_custom_resource_definition(f"things.{group}")
        api.close()


async def create_thing(kubeapi: KubeApi, resource: CustomResource, ns: str, name: str) -> Obj:
    body = {
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "metadata": {"name": name},
        "spec": {"x": 1},
    }

    async def create() -> Obj:
        # The first create after the CRD is Established can still meet a 404 from discovery.
        return await kubeapi.request_json("create", "POST", resource.path(ns), body=body)

    return await eventually(create, f"{resource.kind} {ns}/{name} to be created", within=30)


async def test_bundle_status_merge_patch(
    kubeapi: KubeApi, thing: CustomResource, kube_namespace: str
) -> None:
    ns = kube_namespace
    created = await create_thing(kubeapi, thing, ns, "b1")
    first = {
        "phase": "Ready",
        "observedGeneration": 1,
        "message": "all good",
        "counts": {"bindings": 3, "handlers": 4},
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    stored = await kubeapi.patch_bundle_status(ns, "b1", first, resource=thing)
    assert stored["status"] == first
    assert stored["spec"] == {"x": 1}  # the status subresource leaves the spec alone

    # Rewritten whole: with the previous status given, keys the new one lacks disappear.
    second = {"phase": "Reconciling", "observedGeneration": 2, "counts": {"bindings": 3}}
    stored = await kubeapi.patch_bundle_status(ns, "b1", second, previous=first, resource=thing)
    assert stored["status"] == second
    assert (await kubeapi.get_bundle(ns, "b1", resource=thing))["status"] == second

    # A plain merge patch (no previous) keeps what it does not mention.
    stored = await kubeapi.patch_bundle_status(ns, "b1", {"message": "m"}, resource=thing)
    assert stored["status"] == {**second, "message": "m"}
    assert created["metadata"]["uid"] == stored["metadata"]["uid"]


async def test_bundle_status_precondition_and_refusals(
    kubeapi: KubeApi, thing: CustomResource, kube_namespace: str
) -> None:
    ns = kube_namespace
    created = await create_thing(kubeapi, thing, ns, "b2")
    stale = created["metadata"]["resourceVersion"]
    await kubeapi.patch_bundle_status(ns, "b2", {"phase": "A"}, resource=thing)
    with pytest.raises(Conflict) as conflict:
        await kubeapi.patch_bundle_status(
            ns, "b2", {"phase": "B"}, resource_version=stale, resource=thing
        )
    assert str(conflict.value).startswith(f"patch status of Thing {ns}/b2: ")
    assert (await kubeapi.get_bundle(ns, "b2", resource=thing))["status"] == {"phase": "A"}

    with pytest.raises(ApiRefused) as invalid:  # the schema says integer
        await kubeapi.patch_bundle_status(ns, "b2", {"observedGeneration": "two"}, resource=thing)
    assert invalid.value.status == 422
    assert "observedGeneration" in str(invalid.value) and "\n" not in str(invalid.value)

    with pytest.raises(NotFound, match=f"read Thing {ns}/missing: "):
        await kubeapi.get_bundle(ns, "missing", resource=thing)
    with pytest.raises(NotFound):
        await kubeapi.patch_bundle_status(ns, "missing", {"phase": "A"}, resource=thing)


# --- Jobs, pods, logs -------------------------------------------------------------------------


def job_manifest(name: str, script: str, **labels: str) -> Obj:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "main", "image": "busybox", "command": ["sh", "-c", script]}
                    ],
                }
            },
        },
    }


def condition(job: Obj, kind: str) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c["type"] == kind and c["status"] == "True" for c in conditions)


async def test_create_job_adopts_an_existing_one(kubeapi: KubeApi, kube_namespace: str) -> None:
    ns = kube_namespace
    manifest = job_manifest("probe-abc123", "sleep 30", app="probe", bundle="b")
    first = await kubeapi.create_job(ns, manifest)
    assert first.created
    again = await kubeapi.create_job(ns, manifest)  # a restarted operator asks again
    assert not again.created
    assert again.job["metadata"]["uid"] == first.job["metadata"]["uid"]

    await kubeapi.create_job(ns, job_manifest("other", "true", app="probe", bundle="c"))
    await kubeapi.create_job(ns, job_manifest("unlabelled", "true"))
    listed = await kubeapi.list_jobs(ns, "app=probe,bundle=b")
    assert [j["metadata"]["name"] for j in listed] == ["probe-abc123"]
    assert len(await kubeapi.list_jobs(ns, "app=probe")) == 2

    assert await kubeapi.delete_job(ns, "probe-abc123")
    assert not await kubeapi.delete_job(ns, "never-existed")


async def test_create_job_refusals(kubeapi: KubeApi, kube_namespace: str) -> None:
    bad = job_manifest("bad", "true")
    bad["spec"]["template"]["spec"]["restartPolicy"] = "Always"  # invalid for a Job
    with pytest.raises(ApiRefused) as refused:
        await kubeapi.create_job(kube_namespace, bad)
    assert refused.value.status == 422
    assert str(refused.value).startswith(f"create Job {kube_namespace}/bad: ")
    assert "restartPolicy" in str(refused.value)

    unnamed = job_manifest("x", "true")
    unnamed["metadata"] = {"generateName": "x-"}
    with pytest.raises(ValueError, match=r"needs metadata\.name"):
        await kubeapi.create_job(kube_namespace, unnamed)

    with pytest.raises(NotFound):
        await kubeapi.create_job(f"no-such-ns-{uuid.uuid4().hex[:6]}", job_manifest("j", "true"))


async def test_container_log_with_a_byte_limit(kubeapi: KubeApi, kube_namespace: str) -> None:
    ns = kube_namespace
    script = "for i in 1 2 3 4 5; do echo line-$i; done; printf 'bad \\377 byte\\n'"
    await kubeapi.create_job(ns, job_manifest("talker", script))

    async def complete() -> bool:
        return condition(await kubeapi.get_job(ns, "talker"), "Complete")

    await eventually(complete, "Job talker to complete")
    (pod,) = await kubeapi.list_pods(ns, "job-name=talker")
    name = pod["metadata"]["name"]
    assert (await kubeapi.get_pod(ns, name))["status"]["phase"] == "Succeeded"

    full = await kubeapi.read_container_log(ns, name, "main")
    assert full.text == "line-1\nline-2\nline-3\nline-4\nline-5\nbad \ufffd byte\n"
    assert not full.truncated
    cut = await kubeapi.read_container_log(ns, name, "main", limit_bytes=10)
    assert cut.text == "line-1\nlin" and cut.truncated
    size = len(b"line-1\n" * 5 + b"bad \xff byte\n")  # a limit of exactly the log's size
    exact = await kubeapi.read_container_log(ns, name, "main", limit_bytes=size)
    assert exact.text == full.text and not exact.truncated
    tail = await kubeapi.read_container_log(ns, name, "main", tail_lines=1)
    assert tail.text == "bad \ufffd byte\n"

    with pytest.raises(ApiRefused, match="container nope is not valid"):
        await kubeapi.read_container_log(ns, name, "nope")
    with pytest.raises(NotFound, match=f"read log of {ns}/gone container main: "):
        await kubeapi.read_container_log(ns, "gone", "main")


# --- Events -----------------------------------------------------------------------------------


def core_events(api: ApiClient, ns: str, name: str) -> list[Obj]:
    """Events as ``kubectl describe`` finds them: core/v1, by involvedObject."""
    events = k8s_client.CoreV1Api(api).list_namespaced_event(
        ns, field_selector=f"involvedObject.name={name}"
    )
    return list(api.sanitize_for_serialization(events)["items"])


async def test_events_are_posted_once_redacted_and_bounded(
    kubeapi: KubeApi, kube_api: ApiClient, kube_namespace: str
) -> None:
    ns = kube_namespace
    cm = await kubeapi.request_json(
        "create ConfigMap",
        "POST",
        f"/api/v1/namespaces/{ns}/configmaps",
        body={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "target"}},
    )
    cm |= {"apiVersion": "v1", "kind": "ConfigMap"}
    assert kubeapi.redactor is not None
    kubeapi.redactor.add("s3cr3t-token-value")

    posted = await kubeapi.post_event(
        cm, reason="NewRevision", note="synced main@abc with s3cr3t-token-value", action="Sync"
    )
    assert posted is not None
    assert posted["reportingController"] == "taskhandler-operator"
    assert posted["reportingInstance"] == "test-pod_1a2b"
    assert posted["regarding"]["uid"] == cm["metadata"]["uid"]
    # The same reason and note again (the next reconcile pass): not posted.
    assert (
        await kubeapi.post_event(
            cm, reason="NewRevision", note="synced main@abc with s3cr3t-token-value"
        )
        is None
    )
    warning = await kubeapi.post_event(
        cm, reason="ProbeFailed", note="x" * 5000, type="Warning", action="Probe"
    )
    assert warning is not None and len(warning["note"].encode()) <= 1024

    seen = core_events(kube_api, ns, "target")
    assert sorted(e["reason"] for e in seen) == ["NewRevision", "ProbeFailed"]
    new_revision = next(e for e in seen if e["reason"] == "NewRevision")
    assert new_revision["message"] == "synced main@abc with ***"
    assert new_revision["involvedObject"]["kind"] == "ConfigMap"
    assert new_revision["type"] == "Normal"

    kubeapi.forget_events(ns, "target")  # the object was deleted and re-created
    assert await kubeapi.post_event(
        cm, reason="NewRevision", note="synced main@abc with s3cr3t-token-value"
    )


async def test_event_refusal_is_typed(kubeapi: KubeApi, kube_namespace: str) -> None:
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "namespace": kube_namespace, "name": "x"}
    for _ in range(2):  # a failed post is not remembered: the second one asks again
        with pytest.raises(ApiRefused) as refused:
            await kubeapi.post_event(ref, reason="R", note="n", type="Info")  # type: ignore[arg-type]
        assert refused.value.status == 422
        assert "type" in str(refused.value)


async def test_concurrent_identical_events_are_posted_once(
    kubeapi: KubeApi, kube_api: ApiClient, kube_namespace: str
) -> None:
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "namespace": kube_namespace, "name": "twice"}
    results = await asyncio.gather(
        *(kubeapi.post_event(ref, reason="BindingsPublished", note="12 bindings") for _ in range(5))
    )
    assert sum(r is not None for r in results) == 1
    assert len(core_events(kube_api, kube_namespace, "twice")) == 1


# --- Secrets ----------------------------------------------------------------------------------


async def test_read_secret_registers_its_values_for_redaction(
    kubeapi: KubeApi, kube_namespace: str
) -> None:
    ns = kube_namespace
    value = b"git-password-\x00\xff-binary"
    await kubeapi.request_json(
        "create Secret",
        "POST",
        f"/api/v1/namespaces/{ns}/secrets",
        body={
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds"},
            "data": {"password": base64.b64encode(value).decode(), "user": "Ym9i"},
            "stringData": {"token": "plain-token-123"},
        },
    )
    data = await kubeapi.read_secret(ns, "creds")
    assert data == {"password": value, "user": b"bob", "token": b"plain-token-123"}
    assert kubeapi.redactor is not None
    assert kubeapi.redactor("cloning with plain-token-123") == "cloning with ***"

    with pytest.raises(NotFound) as missing:
        await kubeapi.read_secret(ns, "nope")
    assert str(missing.value) == f'read Secret {ns}/nope: secrets "nope" not found'


async def test_forbidden_is_refused_not_retried(
    kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    from kubernetes import config as k8s_config

    config = kube_cluster.user_kubeconfig("no-rights-user")
    api = k8s_config.new_client_from_config(config_file=str(config))
    kubeapi = KubeApi(api)
    try:
        with pytest.raises(ApiRefused) as forbidden:
            await kubeapi.read_secret(kube_namespace, "anything")
        assert forbidden.value.status == 403 and not forbidden.value.retryable
        assert 'cannot get resource "secrets"' in str(forbidden.value)
    finally:
        await kubeapi.aclose()
        api.close()


# --- Leases, availability, the executor -------------------------------------------------------


async def test_lease_replace_is_optimistic(kubeapi: KubeApi, kube_namespace: str) -> None:
    ns = kube_namespace
    assert await kubeapi.get_lease(ns, "l") is None
    now = micro_time()
    lease = await kubeapi.create_lease(
        ns,
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "l"},
            "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, "renewTime": now},
        },
    )
    with pytest.raises(Conflict):
        await kubeapi.create_lease(ns, lease | {"metadata": {"name": "l"}})
    updated = await kubeapi.replace_lease(
        ns, {**lease, "spec": {**lease["spec"], "holderIdentity": "b"}}
    )
    assert updated["spec"]["holderIdentity"] == "b"
    with pytest.raises(Conflict):  # written from the stale copy
        await kubeapi.replace_lease(ns, {**lease, "spec": {**lease["spec"], "holderIdentity": "c"}})
    assert (await kubeapi.get_lease(ns, "l") or {})["spec"]["holderIdentity"] == "b"


async def test_no_apiserver_is_unavailable() -> None:
    config = Configuration()
    config.host = f"https://127.0.0.1:{free_port()}"
    config.retries = False
    api = ApiClient(config)
    kubeapi = KubeApi(api, request_timeout=5)
    try:
        with pytest.raises(ApiUnavailable) as unavailable:
            await kubeapi.list_jobs("ns", "app=x")
        assert unavailable.value.retryable
        assert str(unavailable.value).startswith("list Jobs in ns (app=x): apiserver unavailable: ")
        assert "\n" not in str(unavailable.value)
    finally:
        await kubeapi.aclose()
        api.close()


async def test_calls_run_on_the_bounded_executor(kube_api: ApiClient, kube_namespace: str) -> None:
    kubeapi = KubeApi(kube_api, max_workers=2, thread_name="bounded")
    seen: set[str] = set()
    inner_send = kubeapi._send

    def spy(*args: Any, **kwargs: Any) -> bytes:
        seen.add(threading.current_thread().name)
        return inner_send(*args, **kwargs)

    kubeapi._send = spy  # type: ignore[method-assign]
    try:
        results = await asyncio.gather(
            *(kubeapi.get_lease(kube_namespace, f"n{i}") for i in range(12))
        )
    finally:
        await kubeapi.aclose()
    assert results == [None] * 12
    assert threading.current_thread().name not in seen
    assert 1 <= len(seen) <= 2 and all(name.startswith("bounded") for name in seen)

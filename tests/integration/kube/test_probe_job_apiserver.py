"""Probe Jobs on the real control plane: Pod Security ``restricted`` admits the builder's pod and
refuses weakened copies (so enforcement is real), the Job controller runs it, the reader explains
its failure, and the garbage collector removes it with its bundle."""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.kubecluster.waits import wait_for
from taskhandler_operator.artifacts.models import Language
from taskhandler_operator.kube.probe_job import (
    BundleIdentity,
    FetchFile,
    ProbeFailure,
    ProbeJobRequest,
    ProbePhase,
    ProbePodSettings,
    ProbeTarget,
    build_probe_job,
    job_outcome,
)
from taskhandler_operator.kube.rbac import probe_service_account
from tests.unit.kube.examples import bundle_body

pytestmark = [pytest.mark.kube, pytest.mark.usefixtures("thb_crd")]

Obj = dict[str, Any]
VIOLATES = 'violates PodSecurity "restricted:latest"'


@pytest.fixture
def restricted(kube_cluster: KubeCluster, kube_namespace: str) -> BundleIdentity:
    """The namespace with ``restricted`` enforced (and warned), the probe account, a bundle."""
    kube_cluster.kubectl(
        "label",
        "namespace",
        kube_namespace,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
        "pod-security.kubernetes.io/warn=restricted",
    )
    create(kube_cluster, probe_service_account(kube_namespace))
    create(kube_cluster, bundle_body("etl", kube_namespace))
    stored = json.loads(
        kube_cluster.kubectl("get", "thb", "etl", "-n", kube_namespace, "-o", "json").stdout
    )
    return BundleIdentity.from_body(stored)


def create(
    cluster: KubeCluster, obj: Obj, *extra: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("create", *extra, "-f", "-", input=json.dumps(obj), check=check)


def probe_job(bundle: BundleIdentity, fetch_timeout: int = 120) -> Obj:
    target = ProbeTarget("bin/etl", 1234, "sha256:" + "c" * 64)
    # Nothing listens on port 1: the download fails at once, whichever fetch is installed.
    url = "http://127.0.0.1:1/files/bin/etl?expires=1&signature=x"
    request = ProbeJobRequest(
        bundle=bundle,
        language=Language.GO,
        target=target,
        files=[FetchFile("bin/etl", url, "d" * 64, 1234)],
        operator_image="registry.local/taskhandler-operator:test",
        runtime_image="registry.local/taskhandler-operator:test",
        settings=ProbePodSettings(fetch_timeout_seconds=fetch_timeout),
    )
    return build_probe_job(request)


def as_pod(job: Obj) -> Obj:
    template = copy.deepcopy(job["spec"]["template"])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": job["metadata"]["name"],
            "namespace": job["metadata"]["namespace"],
            **template["metadata"],
        },
        "spec": template["spec"],
    }


def containers(pod_spec: Obj) -> list[Obj]:
    return [*pod_spec["initContainers"], *pod_spec["containers"]]


def run_as_root_allowed(spec: Obj) -> None:
    spec["securityContext"]["runAsNonRoot"] = False
    for c in containers(spec):
        c["securityContext"]["runAsNonRoot"] = False


def escalation_allowed(spec: Obj) -> None:
    spec["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True


def capabilities_kept(spec: Obj) -> None:
    del spec["containers"][0]["securityContext"]["capabilities"]


def no_seccomp(spec: Obj) -> None:
    del spec["securityContext"]["seccompProfile"]
    for c in containers(spec):
        del c["securityContext"]["seccompProfile"]


def root_user(spec: Obj) -> None:
    spec["securityContext"]["runAsUser"] = 0


def host_path(spec: Obj) -> None:
    spec["volumes"][1] = {"name": "tmp", "hostPath": {"path": "/tmp"}}


WEAKENINGS: list[tuple[Callable[[Obj], None], str]] = [
    (run_as_root_allowed, "runAsNonRoot != true"),
    (escalation_allowed, "allowPrivilegeEscalation != false"),
    (capabilities_kept, "unrestricted capabilities"),
    (no_seccomp, "seccompProfile"),
    (root_user, "runAsUser=0"),
    (host_path, "restricted volume types"),
]


def test_probe_pod_is_admitted_under_restricted(
    kube_cluster: KubeCluster, restricted: BundleIdentity
) -> None:
    job = probe_job(restricted)
    pod = create(kube_cluster, as_pod(job), "--dry-run=server")
    assert pod.returncode == 0 and "Warning" not in pod.stderr, pod.stderr
    created = create(kube_cluster, job, "--dry-run=server")
    assert created.returncode == 0 and "Warning" not in created.stderr, created.stderr


@pytest.mark.parametrize(
    ("weaken", "violation"), WEAKENINGS, ids=[w.__name__ for w, _ in WEAKENINGS]
)
def test_a_weakened_probe_pod_is_refused(
    kube_cluster: KubeCluster,
    restricted: BundleIdentity,
    weaken: Callable[[Obj], None],
    violation: str,
) -> None:
    pod = as_pod(probe_job(restricted))
    weaken(pod["spec"])
    refused = create(kube_cluster, pod, "--dry-run=server", check=False)
    assert refused.returncode != 0
    assert VIOLATES in refused.stderr and violation in refused.stderr, refused.stderr


def test_job_controller_refuses_to_create_a_weakened_jobs_pod(
    kube_cluster: KubeCluster, restricted: BundleIdentity
) -> None:
    job = probe_job(restricted)
    job["metadata"]["name"] = "weakened"
    run_as_root_allowed(job["spec"]["template"]["spec"])
    created = create(kube_cluster, job)
    # Jobs are not enforced, only warned about; their pods are refused.
    assert "would violate PodSecurity" in created.stderr
    ns = restricted.namespace

    def failed_create() -> str | None:
        events = json.loads(
            kube_cluster.kubectl(
                "get",
                "events",
                "-n",
                ns,
                "--field-selector",
                "involvedObject.kind=Job,involvedObject.name=weakened,reason=FailedCreate",
                "-o",
                "json",
            ).stdout
        )["items"]
        return next((e["message"] for e in events if VIOLATES in e["message"]), None)

    message = wait_for(failed_create, "the Job controller's FailedCreate event", timeout=60)
    assert "runAsNonRoot != true" in message


def test_real_job_runs_is_read_back_and_goes_with_its_bundle(
    kube_cluster: KubeCluster, restricted: BundleIdentity
) -> None:
    job = probe_job(restricted, fetch_timeout=5)
    name = job["metadata"]["name"]
    ns = restricted.namespace
    create(kube_cluster, job)
    # A restarted operator creating the same Job again finds it instead of a second one.
    again = create(kube_cluster, job, check=False)
    assert again.returncode != 0 and "AlreadyExists" in again.stderr

    def read(kind: str, *args: str) -> Obj:
        out = kube_cluster.kubectl("get", kind, *args, "-n", ns, "-o", "json").stdout
        result: Obj = json.loads(out)
        return result

    def finished() -> Any:
        current = read("job", name)
        pods = read("pods", "-l", f"batch.kubernetes.io/job-name={name}")["items"]
        outcome = job_outcome(current, pods[0] if pods else None)
        return outcome if outcome.finished else None

    outcome = wait_for(finished, f"probe Job {name} to finish", timeout=120)
    # The pod passed admission and ran: its init container could not download the artifact.
    assert outcome.phase is ProbePhase.FAILED
    assert outcome.reason == ProbeFailure.FETCH_FAILED, outcome
    assert outcome.message.startswith("downloading the artifact into the probe pod failed: ")

    kube_cluster.kubectl("delete", "thb", "etl", "-n", ns, "--wait=false")

    def job_gone() -> bool:
        listed = kube_cluster.kubectl("get", "jobs", "-n", ns, "-o", "name").stdout
        return f"job.batch/{name}" not in listed

    # The garbage collector picks up a new resource kind at its next discovery resync (30 s),
    # so right after the CRD was installed this can take that long.
    wait_for(job_gone, "the garbage collector to delete the bundle's Job", timeout=120)

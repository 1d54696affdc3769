"""The probe Job manifest (tested on its output) and the reading of a finished Job."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from taskhandler_operator.artifacts.models import Language
from taskhandler_operator.kube.probe_job import (
    BundleIdentity,
    FetchFile,
    ProbeFailure,
    ProbeJobRequest,
    ProbePhase,
    ProbePodSettings,
    ProbeTarget,
    adoptable,
    build_probe_job,
    job_outcome,
    job_view,
    pod_settled,
    pod_view,
    probe_job_name,
    probe_job_selector,
    read_probe_target,
    template_hash,
)
from taskhandler_operator.kube.spec import ProbeSpec, TaskHandlerBundleSpec
from taskhandler_operator.protocol.summary import ProbeErrorKind, ProbeSummary
from tests.unit.kube.examples import bundle_body

BUNDLE = BundleIdentity("team-a", "etl", "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "etl-bundle")
TARGET = ProbeTarget("bin/etl", 4096, "sha256:" + "c" * 64)
DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def fetch_file(path: str = "bin/etl", size: int = 4096) -> FetchFile:
    return FetchFile(path, f"http://thop.svc:8080/f/{path}?sig=x&exp=1", "d" * 64, size)


def request(**changes: Any) -> ProbeJobRequest:
    base: dict[str, Any] = {
        "bundle": BUNDLE,
        "language": Language.GO,
        "target": TARGET,
        "files": [fetch_file()],
        "operator_image": "registry.local/taskhandler-operator:1.0",
        "runtime_image": "registry.local/taskhandler-operator:1.0",
    }
    base.update(changes)
    return ProbeJobRequest(**base)


def pod_spec(job: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = job["spec"]["template"]["spec"]
    return spec


# --- the manifest ------------------------------------------------------------------------------


def test_job_identity_owner_labels_and_annotations() -> None:
    job = build_probe_job(request())
    meta = job["metadata"]
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    assert meta["namespace"] == "team-a"
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "langsdk.dev/v1alpha1",
            "kind": "TaskHandlerBundle",
            "name": "etl",
            "uid": BUNDLE.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    identity = {
        "app.kubernetes.io/managed-by": "taskhandler-operator",
        "app.kubernetes.io/name": "taskhandler-probe",
        "langsdk.dev/bundle": "etl",
        "langsdk.dev/bundle-uid": BUNDLE.uid,
    }
    assert meta["labels"] == {**identity, "langsdk.dev/pod-template-hash": template_hash(request())}
    assert job["spec"]["template"]["metadata"]["labels"] == identity
    assert read_probe_target(job) == TARGET
    assert probe_job_selector(BUNDLE) == (
        "app.kubernetes.io/managed-by=taskhandler-operator,"
        f"app.kubernetes.io/name=taskhandler-probe,langsdk.dev/bundle-uid={BUNDLE.uid}"
    )


def test_name_is_stable_and_changes_with_each_identity_part() -> None:
    name = probe_job_name(BUNDLE, TARGET)
    assert name == probe_job_name(BUNDLE, ProbeTarget("bin/etl", 4096, TARGET.cache_digest))
    assert name.startswith("etl-etl-") and DNS_1123_LABEL.match(name)
    others = {
        probe_job_name(BUNDLE, ProbeTarget("bin/etl2", 4096, TARGET.cache_digest)),
        probe_job_name(BUNDLE, ProbeTarget("bin/etl", 4097, TARGET.cache_digest)),
        probe_job_name(BUNDLE, ProbeTarget("bin/etl", 4096, None)),
        probe_job_name(BundleIdentity("team-a", "etl", "other-uid", "etl-bundle"), TARGET),
        probe_job_name(BundleIdentity("team-b", "etl", BUNDLE.uid, "etl-bundle"), TARGET),
    }
    assert name not in others and len(others) == 5


def test_the_name_changes_with_everything_that_shapes_the_pod() -> None:
    """A fixed spec (more memory, a longer timeout, another image or node) gets a new Job; the
    old failed one, kept for its TTL, is never adopted in its place (issue 20, item 5)."""
    base = build_probe_job(request())
    changed = [
        request(probe=ProbeSpec.model_validate({"resources": {"limits": {"memory": "1Gi"}}})),
        request(probe=ProbeSpec.model_validate({"timeout": "5m"})),
        request(runtime_image="registry.local/other:2.0"),
        request(operator_image="registry.local/taskhandler-operator:1.1"),
        request(probe=ProbeSpec.model_validate({"nodeSelector": {"pool": "probes"}})),
        request(settings=ProbePodSettings(run_as_user=1000)),
        request(files=[FetchFile("bin/etl", fetch_file().url, "f" * 64, 4096)]),
    ]
    names = {build_probe_job(r)["metadata"]["name"] for r in changed}
    assert base["metadata"]["name"] not in names and len(names) == len(changed)
    for r in changed:
        job = build_probe_job(r)
        assert len(job["metadata"]["name"]) <= 63 and DNS_1123_LABEL.match(job["metadata"]["name"])
        assert not adoptable(base, job) and not adoptable(job, base)


def test_the_name_ignores_the_download_urls_signed_afresh_each_pass() -> None:
    resigned = FetchFile("bin/etl", "http://thop.svc:8080/f/bin/etl?sig=y&exp=2", "d" * 64, 4096)
    first, again = build_probe_job(request()), build_probe_job(request(files=[resigned]))
    assert first["metadata"] == again["metadata"]
    assert adoptable(again, first)


def test_a_job_of_another_owner_or_without_the_hash_is_not_adoptable() -> None:
    job = build_probe_job(request())
    unlabelled = json.loads(json.dumps(job))
    del unlabelled["metadata"]["labels"]["langsdk.dev/pod-template-hash"]
    foreign = json.loads(json.dumps(job))
    foreign["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    assert adoptable(job, job)
    assert not adoptable(unlabelled, job) and not adoptable(foreign, job)


@pytest.mark.parametrize(
    ("bundle_name", "rel_path"),
    [
        ("a" * 63, "lib/" + "Very_Long.Artifact-Name" * 10 + ".jar"),
        ("x", "___.min.mjs"),
        ("x.y", "--/..weird/ÄÖÜ.jar"),
        ("b", "dir/.hidden"),
    ],
)
def test_name_is_a_dns_label_of_at_most_63(bundle_name: str, rel_path: str) -> None:
    bundle = BundleIdentity("ns", bundle_name, "u", "b")
    name = probe_job_name(bundle, ProbeTarget(rel_path, 1, None))
    assert len(name) <= 63 and DNS_1123_LABEL.match(name), name


def test_init_container_fetches_exactly_the_manifest() -> None:
    files = [fetch_file("lib/a.jar", 100), fetch_file("lib/b.jar", 200), fetch_file("app.jar", 50)]
    job = build_probe_job(
        request(language=Language.JAVA, target=ProbeTarget("app.jar", 50, None), files=files)
    )
    (fetch,) = pod_spec(job)["initContainers"]
    assert fetch["image"] == "registry.local/taskhandler-operator:1.0"
    command = fetch["command"]
    assert command[:4] == ["taskhandler-operator", "fetch", "--dest", "/bundle"]
    assert command[4] == "--manifest"
    assert json.loads(command[5]) == [f.to_manifest() for f in files]
    assert command[6:] == ["--timeout", "120", "--max-bytes", "350"]
    assert fetch["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert {"name": "bundle", "mountPath": "/bundle"} in fetch["volumeMounts"]


def test_probe_container_runs_the_driver_on_the_fetched_artifact() -> None:
    spec = ProbeSpec(timeout="90s")
    job = build_probe_job(
        request(language=Language.TYPESCRIPT, runtime_image="node-probe:1", probe=spec)
    )
    (probe,) = pod_spec(job)["containers"]
    assert probe["image"] == "node-probe:1"
    assert probe["command"] == [
        "taskhandler-operator",
        "probe",
        "/bundle/bin/etl",
        "--language",
        "typescript",
        "--bundle-root",
        "/bundle",
        "--bundle-name",
        "etl-bundle",
        "--timeout",
        "90",
    ]
    assert probe["terminationMessagePath"] == "/dev/termination-log"
    assert probe["terminationMessagePolicy"] == "File"
    assert {"name": "bundle", "mountPath": "/bundle", "readOnly": True} in probe["volumeMounts"]
    assert {"name": "tmp", "mountPath": "/tmp"} in probe["volumeMounts"]


def test_pod_is_restricted_and_has_no_token() -> None:
    job = build_probe_job(request())
    spec = pod_spec(job)
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert spec["serviceAccountName"] == "taskhandler-probe"
    assert spec["enableServiceLinks"] is False
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "fsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    for container in [*spec["initContainers"], *spec["containers"]]:
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        assert set(container["resources"]) == {"requests", "limits"}
    assert spec["volumes"] == [
        {"name": "bundle", "emptyDir": {"sizeLimit": "17Mi"}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
    ]


def test_job_bounds() -> None:
    job = build_probe_job(request(probe=ProbeSpec(timeout="2m")))
    # fetch 120 + connect 10 + answer 120 + exit grace 5 + allowance 120
    assert job["spec"]["activeDeadlineSeconds"] == 375
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["ttlSecondsAfterFinished"] == 600


def test_resources_default_and_bundle_overrides() -> None:
    job = build_probe_job(request())
    assert pod_spec(job)["containers"][0]["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"cpu": "1", "memory": "512Mi"},
    }
    raised = ProbeSpec.model_validate({"resources": {"requests": {"memory": "1Gi", "cpu": 2}}})
    resources = pod_spec(build_probe_job(request(probe=raised)))["containers"][0]["resources"]
    # A request above a default limit lifts the limit with it.
    assert resources == {
        "requests": {"cpu": "2", "memory": "1Gi"},
        "limits": {"cpu": "2", "memory": "1Gi"},
    }
    lowered = ProbeSpec.model_validate({"resources": {"limits": {"memory": "64Mi"}}})
    resources = pod_spec(build_probe_job(request(probe=lowered)))["containers"][0]["resources"]
    # A limit below a default request pulls the request down.
    assert resources["requests"]["memory"] == "64Mi" and resources["limits"]["memory"] == "64Mi"


def test_scheduling_settings_and_image_override_come_from_the_bundle() -> None:
    body = bundle_body(
        probe={
            "image": "registry.local/probe-java:2",
            "nodeSelector": {"pool": "probes"},
            "tolerations": [{"key": "probes", "operator": "Exists", "effect": "NoSchedule"}],
        },
        language="java",
    )
    spec = TaskHandlerBundleSpec.model_validate(body["spec"])
    req = ProbeJobRequest.for_bundle(
        BUNDLE,
        spec,
        ProbeTarget("app.jar", 10, None),
        [fetch_file("app.jar", 10)],
        operator_image="op:1",
        runtime_images={Language.JAVA: "java-default:1"},
        settings=ProbePodSettings(image_pull_policy="IfNotPresent", service_account="probes"),
    )
    pod = pod_spec(build_probe_job(req))
    assert pod["containers"][0]["image"] == "registry.local/probe-java:2"
    assert pod["containers"][0]["imagePullPolicy"] == "IfNotPresent"
    assert pod["nodeSelector"] == {"pool": "probes"}
    assert pod["tolerations"] == [{"key": "probes", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["serviceAccountName"] == "probes"
    assert "--language" in pod["containers"][0]["command"]
    assert "java" in pod["containers"][0]["command"]


def test_runtime_image_comes_from_the_language_and_go_runs_in_the_operator_image() -> None:
    def image(language: str, **probe: Any) -> str:
        spec = TaskHandlerBundleSpec.model_validate(
            bundle_body(language=language, probe=probe)["spec"]
        )
        req = ProbeJobRequest.for_bundle(
            BUNDLE,
            spec,
            TARGET,
            [fetch_file()],
            operator_image="op:1",
            runtime_images={Language.TYPESCRIPT: "node-probe:1"},
        )
        return req.runtime_image

    assert image("typescript") == "node-probe:1"
    assert image("go") == "op:1"
    assert image("go", image="custom:2") == "custom:2"
    with pytest.raises(ValueError, match="no probe image for java artifacts: configure"):
        image("java")


def test_identity_from_a_bundle_object() -> None:
    body = bundle_body(name="etl", namespace="team-a")
    body["metadata"]["uid"] = BUNDLE.uid
    assert BundleIdentity.from_body(body) == BUNDLE


@pytest.mark.parametrize(
    ("target", "files", "message"),
    [
        (ProbeTarget("/etc/passwd", 1, None), [], "must be relative"),
        (ProbeTarget("../x", 1, None), [], "must be relative"),
        (ProbeTarget("bin/etl", 1, None), [fetch_file("bin/other")], "do not include"),
        (ProbeTarget("bin/etl", 1, None), [fetch_file(), fetch_file()], "one path twice"),
    ],
)
def test_bad_requests_are_refused(
    target: ProbeTarget, files: list[FetchFile], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build_probe_job(request(target=target, files=files))


def test_read_probe_target_of_a_foreign_job_is_none() -> None:
    assert read_probe_target({"metadata": {"name": "x"}}) is None
    assert (
        read_probe_target({"metadata": {"annotations": {"langsdk.dev/artifact-path": "a"}}}) is None
    )


# --- reading a Job back ------------------------------------------------------------------------


def job_json(*conditions: tuple[str, str], deadline: int = 375) -> dict[str, Any]:
    return {
        "metadata": {"name": "etl-etl-0123456789"},
        "spec": {"activeDeadlineSeconds": deadline},
        "status": {
            "conditions": [
                {"type": t, "status": "True", "reason": r, "message": f"{r} happened"}
                for t, r in conditions
            ]
        },
    }


def pod_json(
    probe: dict[str, Any] | None = None,
    fetch: dict[str, Any] | None = None,
    reason: str | None = None,
    conditions: list[dict[str, Any]] | None = None,
    memory: str = "512Mi",
) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": conditions or []}
    if reason:
        status["reason"], status["message"] = reason, f"{reason}: the node said so"
    status["initContainerStatuses"] = [{"name": "fetch", "state": fetch or {}}]
    status["containerStatuses"] = [{"name": "probe", "state": probe or {}}]
    return {
        "spec": {"containers": [{"name": "probe", "resources": {"limits": {"memory": memory}}}]},
        "status": status,
    }


def terminated(code: int, message: str = "", reason: str = "Error") -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "reason": reason, "message": message}}


def summary_text(**fields: Any) -> str:
    base: dict[str, Any] = {"status": "ok", "artifact": "/bundle/bin/etl", "language": "go"}
    base.update(fields)
    return ProbeSummary.model_validate(base).to_json()


OK_SUMMARY = summary_text(result_sha256="e" * 64, result_bytes=10, handler_count=2, dag_count=1)
FETCHED = terminated(0, reason="Completed")


def test_succeeded_job_returns_the_summary_to_check_against_the_log() -> None:
    pod = pod_json(probe=terminated(0, OK_SUMMARY, "Completed"), fetch=FETCHED)
    outcome = job_outcome(job_json(("SuccessCriteriaMet", "x"), ("Complete", "x")), pod)
    assert outcome.phase is ProbePhase.SUCCEEDED and outcome.finished
    assert outcome.summary is not None and outcome.summary.result_sha256 == "e" * 64


@pytest.mark.parametrize(
    ("code", "kind", "reason", "lead"),
    [
        (
            3,
            ProbeErrorKind.ARTIFACT_REFUSED,
            ProbeFailure.ARTIFACT_REFUSED,
            "the artifact was refused",
        ),
        (
            1,
            ProbeErrorKind.ANSWER_TIMEOUT,
            ProbeFailure.RUNTIME_FAILED,
            "the runtime failed the probe",
        ),
        (
            4,
            ProbeErrorKind.LAUNCH_FAILED,
            ProbeFailure.DRIVER_ERROR,
            "the probe driver could not run the artifact",
        ),
    ],
)
def test_driver_exit_codes_become_reasons_in_words(
    code: int, kind: ProbeErrorKind, reason: ProbeFailure, lead: str
) -> None:
    text = summary_text(status="error", error_kind=kind.value, error="it went wrong")
    pod = pod_json(probe=terminated(code, text), fetch=FETCHED)
    outcome = job_outcome(job_json(("FailureTarget", "PodFailurePolicy")), pod, "last words\n")
    assert outcome.phase is ProbePhase.FAILED
    assert outcome.reason == reason
    assert outcome.message == f"{lead} ({kind.value}): it went wrong; last log line: last words"
    assert outcome.summary is not None and outcome.summary.error == "it went wrong"


def test_deadline_exceeded_names_the_deadline_and_the_fix() -> None:
    running = {"running": {"startedAt": "x"}}
    outcome = job_outcome(job_json(("Failed", "DeadlineExceeded")), pod_json(running, FETCHED))
    assert outcome.reason == ProbeFailure.DEADLINE_EXCEEDED
    assert outcome.message == (
        "the probe did not finish within its deadline of 375s (stopped while probing); "
        "raise spec.probe.timeout if the runtime needs longer to answer"
    )
    gone = job_outcome(job_json(("Failed", "DeadlineExceeded")), None)
    assert "stopped while downloading the artifact" in gone.message


def test_oom_killed_names_the_limit() -> None:
    pod = pod_json(probe=terminated(137, reason="OOMKilled"), fetch=FETCHED, memory="256Mi")
    outcome = job_outcome(job_json(("Failed", "BackoffLimitExceeded")), pod)
    assert outcome.reason == ProbeFailure.OUT_OF_MEMORY
    assert outcome.message == (
        "the probe ran out of memory (limit 256Mi); raise spec.probe.resources.limits.memory"
    )


def test_fetch_oom_killed_is_out_of_memory_not_a_failed_download() -> None:
    fetch = terminated(137, reason="OOMKilled")
    pod = pod_json(fetch=fetch, memory="24Mi")
    outcome = job_outcome(job_json(("Failed", "BackoffLimitExceeded")), pod)
    assert outcome.reason == ProbeFailure.OUT_OF_MEMORY
    assert outcome.message == (
        "the probe ran out of memory while downloading the artifact (limit 24Mi); "
        "raise spec.probe.resources.limits.memory"
    )


def test_evicted_pod() -> None:
    pod = pod_json(probe=terminated(137), fetch=FETCHED, reason="Evicted")
    outcome = job_outcome(job_json(("Failed", "BackoffLimitExceeded")), pod)
    assert outcome.reason == ProbeFailure.EVICTED
    assert outcome.message == "the probe pod was evicted: Evicted: the node said so"


def test_failed_download_quotes_the_fetch_message() -> None:
    fetch = terminated(1, "retrying\nerror: app.jar: sha256 mismatch (want d…, got 0…)\n")
    outcome = job_outcome(job_json(("Failed", "BackoffLimitExceeded")), pod_json(fetch=fetch))
    assert outcome.reason == ProbeFailure.FETCH_FAILED
    assert outcome.message == (
        "downloading the artifact into the probe pod failed: "
        "error: app.jar: sha256 mismatch (want d…, got 0…)"
    )


def test_crash_without_summary() -> None:
    pod = pod_json(probe=terminated(128, "exec: not found", "StartError"), fetch=FETCHED)
    outcome = job_outcome(job_json(("Failed", "BackoffLimitExceeded")), pod)
    assert outcome.reason == ProbeFailure.PROBE_CRASHED
    assert outcome.message == (
        "the probe container exited with code 128 (StartError): exec: not found"
    )


def test_lost_and_deleted_jobs() -> None:
    assert job_outcome(None, None).reason == ProbeFailure.JOB_DELETED
    finished = job_outcome(job_json(("Complete", "x")), None)
    assert finished.reason == ProbeFailure.POD_LOST and "its pod is gone" in finished.message
    failed = job_outcome(job_json(("Failed", "BackoffLimitExceeded")), None)
    assert failed.reason == ProbeFailure.POD_LOST
    assert "BackoffLimitExceeded: BackoffLimitExceeded happened" in failed.message


def test_a_pod_deleted_or_disrupted_mid_probe_is_lost_not_an_answer() -> None:
    # kubectl delete pod: the container ends on SIGTERM (143) while the pod is being deleted.
    deleted = pod_json(probe=terminated(143), fetch=FETCHED)
    deleted["metadata"] = {"deletionTimestamp": "2026-12-01T00:00:30Z"}
    outcome = job_outcome(job_json(("Failed", "BackoffLimitExceeded")), deleted, "bye\n")
    assert outcome.reason == ProbeFailure.POD_LOST
    assert outcome.message == (
        "the probe pod was deleted before the probe finished; it will be probed again"
    )
    # Its node gone: the pod garbage collector marks it before deleting it.
    gone = pod_json(
        fetch=FETCHED,
        conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC"}],
    )
    outcome = job_outcome(job_json(("Failed", "BackoffLimitExceeded")), gone)
    assert outcome.reason == ProbeFailure.POD_LOST
    assert "disrupted (DeletionByPodGC)" in outcome.message
    # The deadline and eviction keep their own reasons (both delete or disrupt the pod too).
    deleted["status"]["reason"] = "Evicted"
    evicted = job_outcome(job_json(("Failed", "BackoffLimitExceeded")), deleted)
    assert evicted.reason == ProbeFailure.EVICTED
    late = job_outcome(job_json(("Failed", "DeadlineExceeded")), deleted)
    assert late.reason == ProbeFailure.DEADLINE_EXCEEDED
    # A pod deleted after it answered successfully is still a success.
    answered = pod_json(probe=terminated(0, OK_SUMMARY, "Completed"), fetch=FETCHED)
    answered["metadata"] = {"deletionTimestamp": "2026-12-01T00:00:30Z"}
    assert job_outcome(job_json(("Complete", "x")), answered).phase is ProbePhase.SUCCEEDED


def test_zero_exit_without_a_valid_summary_is_not_a_success() -> None:
    pod = pod_json(probe=terminated(0, "not json", "Completed"), fetch=FETCHED)
    outcome = job_outcome(job_json(("Complete", "x")), pod)
    assert outcome.reason == ProbeFailure.INVALID_SUMMARY


@pytest.mark.parametrize(
    ("pod", "reason", "message"),
    [
        (None, "Pending", "waiting for the probe pod"),
        (
            pod_json(
                conditions=[
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/1 nodes match",
                    }
                ]
            ),
            "Unschedulable",
            "the probe pod cannot be scheduled: 0/1 nodes match",
        ),
        (
            pod_json(fetch={"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}),
            "ImagePullBackOff",
            "the fetch container is waiting: no such image",
        ),
        (pod_json(fetch={"running": {}}), "Fetching", "downloading the artifact"),
        (
            pod_json(fetch=FETCHED, probe={"running": {}}),
            "Probing",
            "the probe is running",
        ),
    ],
)
def test_running_job_says_where_it_is(
    pod: dict[str, Any] | None, reason: str, message: str
) -> None:
    outcome = job_outcome(job_json(), pod)
    assert (outcome.phase, outcome.reason, outcome.message) == (ProbePhase.RUNNING, reason, message)
    assert not outcome.finished


# --- the watch's views ---------------------------------------------------------------------------


def _full_pod(pod: dict[str, Any], phase: str | None = None) -> dict[str, Any]:
    """A pod as the API serves it: the fields the view drops as well."""
    full: dict[str, Any] = json.loads(json.dumps(pod))
    full["metadata"] = {
        "name": "etl-etl-0123456789-abcde",
        "namespace": "team-a",
        "creationTimestamp": "2026-01-01T00:00:00Z",
        "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
        "labels": {"batch.kubernetes.io/job-name": "etl-etl-0123456789"},
    }
    full["spec"]["containers"][0]["command"] = ["taskhandler-operator", "probe", "x" * 1000]
    full["spec"]["volumes"] = [{"name": "bundle", "emptyDir": {}}]
    if phase:
        full["status"]["phase"] = phase
    return full


@pytest.mark.parametrize(
    ("job", "pod"),
    [
        (job_json(("Complete", "Completed")), pod_json(terminated(0, OK_SUMMARY, "Completed"))),
        (job_json(("Failed", "BackoffLimitExceeded")), pod_json(terminated(137, "", "OOMKilled"))),
        (job_json(("Failed", "DeadlineExceeded")), pod_json({"running": {}}, FETCHED)),
        (job_json(("Failed", "BackoffLimitExceeded")), pod_json(fetch=terminated(1, "403"))),
        (job_json(), pod_json(fetch={"running": {}})),
        (job_json(), pod_json(conditions=[{"type": "PodScheduled", "status": "False"}])),
        (job_json(("Failed", "BackoffLimitExceeded")), pod_json(reason="Evicted")),
    ],
)
def test_the_watch_views_read_as_the_whole_objects(
    job: dict[str, Any], pod: dict[str, Any]
) -> None:
    """The index keeps views, not objects: every outcome reads the same from them."""
    full = _full_pod(pod)
    assert job_outcome(job_view(job), pod_view(full), "tail") == job_outcome(job, full, "tail")
    view = pod_view(full)
    assert "managedFields" not in view["metadata"] and "volumes" not in view["spec"]
    assert "command" not in view["spec"]["containers"][0]


def test_a_finished_job_waits_for_its_pod_to_end_unless_its_deadline_ended_it() -> None:
    done = job_json(("Complete", "Completed"))
    running = pod_view(_full_pod(pod_json({"running": {}}), "Running"))
    ended = pod_view(_full_pod(pod_json(terminated(0, OK_SUMMARY, "Completed")), "Succeeded"))
    assert not pod_settled(done, running) and not pod_settled(done, None)
    assert pod_settled(done, ended)
    assert pod_settled(job_json(("Failed", "DeadlineExceeded")), running)

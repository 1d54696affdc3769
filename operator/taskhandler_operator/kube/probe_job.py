"""Probe Jobs: the manifest for one artifact's probe, and what a finished one means (pure).

One Job per artifact to probe (DESIGN §3.5). Its name is derived from (bundle, relative path,
size, cache digest) and from the hash of its pod template (as a Deployment's ReplicaSets carry
``pod-template-hash``), so a restarted operator finds the Job it created before instead of
creating a second one, while a changed spec (more memory, a longer timeout, another image) gets
a new Job instead of adopting the old one's failure; its annotations say which artifact it
probes and its label :data:`~taskhandler_operator.kube.names.LABEL_TEMPLATE_HASH` which template
built it (checked on adoption: :func:`adoptable`). The pod:

* an init container (operator image) runs ``taskhandler-operator fetch`` with signed URLs for
  the artifact (for Java the whole classpath) into an ``emptyDir`` mounted at ``/bundle``, each
  file verified by its SHA-256;
* the probe container (the runtime image) runs ``taskhandler-operator probe`` on it, with
  ``/bundle`` read-only; the driver writes its summary to the termination message and the
  full result to its log;
* no service-account token, non-root numeric ids, read-only root filesystem (``/tmp`` is an
  ``emptyDir``), no privilege escalation, all capabilities dropped, ``RuntimeDefault`` seccomp,
  requests and limits — Pod Security ``restricted`` admits it;
* ``backoffLimit: 0`` (a probe is not retried blindly), ``activeDeadlineSeconds``,
  ``ttlSecondsAfterFinished``.

:func:`job_outcome` reads a Job and its pod (the JSON the API returns) back into running,
succeeded (with the summary to check against the log) or failed with a reason in words.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import ValidationError

from taskhandler_operator.artifacts.models import Language
from taskhandler_operator.kube import names
from taskhandler_operator.kube.duration import parse_duration
from taskhandler_operator.kube.markers import quantity_value
from taskhandler_operator.kube.spec import ProbeSpec, TaskHandlerBundleSpec
from taskhandler_operator.protocol.summary import ExitCode, ProbeSummary

__all__ = [
    "BUNDLE_MOUNT",
    "FETCH_CONTAINER",
    "PROBE_CONTAINER",
    "BundleIdentity",
    "FetchFile",
    "ProbeFailure",
    "ProbeJobOutcome",
    "ProbeJobRequest",
    "ProbePhase",
    "ProbePodSettings",
    "ProbeTarget",
    "adoptable",
    "build_probe_job",
    "job_outcome",
    "job_view",
    "pod_job_name",
    "pod_settled",
    "pod_view",
    "probe_job_labels",
    "probe_job_name",
    "probe_job_selector",
    "read_probe_target",
    "template_hash",
]

BUNDLE_MOUNT = "/bundle"
TMP_MOUNT = "/tmp"  # noqa: S108 - a per-pod emptyDir, not the host's /tmp
FETCH_CONTAINER = "fetch"
PROBE_CONTAINER = "probe"
TERMINATION_LOG = "/dev/termination-log"
MAX_NAME = 63  # a Job name is also a label value on its pods
HASH_CHARS = 10
TEMPLATE_HASH_CHARS = 16  # in a label value (at most 63)
MIB = 1024 * 1024
MAX_LOG_LINE_CHARS = 300  # of the log line quoted in a failure message

# The probe driver's own bounds around the answer timeout (protocol/commands.py defaults).
DRIVER_CONNECT_SECONDS = 10
DRIVER_EXIT_GRACE_SECONDS = 5


@dataclass(frozen=True)
class BundleIdentity:
    """The TaskHandlerBundle a probe Job belongs to (its owner)."""

    namespace: str
    name: str
    uid: str
    bundle_name: str

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> BundleIdentity:
        """From a TaskHandlerBundle object as the API returns it."""
        meta = body["metadata"]
        return cls(meta["namespace"], meta["name"], meta["uid"], body["spec"]["bundleName"])


@dataclass(frozen=True)
class ProbeTarget:
    """The artifact a Job probes, as the listing saw it."""

    rel_path: str
    size: int
    cache_digest: str | None


@dataclass(frozen=True)
class FetchFile:
    """One file the init container downloads: where it goes, from where, and its digest."""

    path: str
    url: str
    sha256: str
    size: int

    def to_manifest(self) -> dict[str, Any]:
        return {"path": self.path, "url": self.url, "sha256": self.sha256, "size": self.size}


@dataclass(frozen=True)
class ProbePodSettings:
    """Operator-wide settings of probe pods (the chart sets them; defaults suit most clusters)."""

    service_account: str = "taskhandler-probe"
    run_as_user: int = 65532
    run_as_group: int = 65532
    fs_group: int = 65532
    ttl_seconds_after_finished: int = 600
    fetch_timeout_seconds: int = 120
    # Scheduling, image pull and process start, on top of the download and probe bounds.
    deadline_allowance_seconds: int = 120
    tmp_size_limit: str = "64Mi"
    bundle_headroom_bytes: int = 16 * MIB
    image_pull_policy: str | None = None
    default_requests: Mapping[str, str] = field(
        default_factory=lambda: {"cpu": "100m", "memory": "128Mi"}
    )
    # A JVM with a small heap fits in 512Mi; a bundle can ask for more.
    default_limits: Mapping[str, str] = field(
        default_factory=lambda: {"cpu": "1", "memory": "512Mi"}
    )


@dataclass(frozen=True)
class ProbeJobRequest:
    """Everything :func:`build_probe_job` needs; no I/O happens in building."""

    bundle: BundleIdentity
    language: Language
    target: ProbeTarget
    files: Sequence[FetchFile]
    operator_image: str
    runtime_image: str
    probe: ProbeSpec = field(default_factory=ProbeSpec)
    settings: ProbePodSettings = field(default_factory=ProbePodSettings)
    # The request's ``dag_ids`` (``probe --dag-id``): the stub Dags of the bundle's queues.
    dag_ids: tuple[str, ...] | None = None

    @classmethod
    def for_bundle(
        cls,
        bundle: BundleIdentity,
        spec: TaskHandlerBundleSpec,
        target: ProbeTarget,
        files: Sequence[FetchFile],
        *,
        operator_image: str,
        runtime_images: Mapping[Language, str],
        settings: ProbePodSettings | None = None,
        dag_ids: Sequence[str] | None = None,
    ) -> ProbeJobRequest:
        """The request for a bundle spec.

        The probe container's image is ``spec.probe.image`` if set, else the operator's runtime
        image for the language; Go artifacts are static executables, so Go defaults to the
        operator image. ``ValueError`` when no image is known for the language.
        """
        image = spec.probe.image or runtime_images.get(spec.language)
        if image is None and spec.language is Language.GO:
            image = operator_image
        if image is None:
            raise ValueError(
                f"no probe image for {spec.language.value} artifacts: configure the operator's "
                f"{spec.language.value} runtime image or set spec.probe.image"
            )
        return cls(
            bundle=bundle,
            language=spec.language,
            target=target,
            files=tuple(files),
            operator_image=operator_image,
            runtime_image=image,
            probe=spec.probe,
            settings=settings or ProbePodSettings(),
            dag_ids=None if dag_ids is None else tuple(sorted(set(dag_ids))),
        )


# --- naming and labels --------------------------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-")


def probe_job_name(bundle: BundleIdentity, target: ProbeTarget, template: str = "") -> str:
    """``<bundle>-<artifact stem>-<hash>``: DNS-1123, at most 63 characters, stable.

    The hash covers the owner's uid too, so a bundle deleted and created again under the same
    name never adopts a Job of its predecessor (which the garbage collector removes anyway), and
    ``template`` (:func:`template_hash`), so a Job built from another pod template (the spec's
    resources, timeout or image changed since) is never adopted: a failed Job stays until its
    TTL, and the fixed spec would otherwise get its old answer back.
    """
    identity = "\0".join(
        (
            bundle.namespace,
            bundle.name,
            bundle.uid,
            target.rel_path,
            str(target.size),
            target.cache_digest or "",
            template,
        )
    )
    digest = hashlib.sha256(identity.encode()).hexdigest()[:HASH_CHARS]
    stem = target.rel_path.rsplit("/", 1)[-1].split(".", 1)[0]
    readable = _slug(f"{bundle.name}-{stem}")[: MAX_NAME - HASH_CHARS - 1].strip("-")
    return f"{readable}-{digest}" if readable else f"probe-{digest}"


def probe_job_labels(bundle: BundleIdentity) -> dict[str, str]:
    return {
        names.LABEL_MANAGED_BY: names.MANAGER,
        names.LABEL_NAME: names.PROBE_APP,
        names.LABEL_BUNDLE: bundle.name,
        names.LABEL_BUNDLE_UID: bundle.uid,
    }


def probe_job_selector(bundle: BundleIdentity | None = None) -> str:
    """Label selector for probe Jobs (and their pods): all of them, or one bundle's."""
    parts = [f"{names.LABEL_MANAGED_BY}={names.MANAGER}", f"{names.LABEL_NAME}={names.PROBE_APP}"]
    if bundle is not None:
        parts.append(f"{names.LABEL_BUNDLE_UID}={bundle.uid}")
    return ",".join(parts)


def adoptable(job: Mapping[str, Any], manifest: Mapping[str, Any]) -> bool:
    """Whether an existing ``job`` of the manifest's name may stand for ``manifest``: the same
    owner (controller uid) and the same pod-template hash label. The name carries both, so a
    mismatch means a Job someone else made under that name, or one of an operator version that
    did not label its template."""
    meta, want = job.get("metadata") or {}, manifest.get("metadata") or {}
    labels, wanted = meta.get("labels") or {}, want.get("labels") or {}
    if labels.get(names.LABEL_TEMPLATE_HASH) != wanted.get(names.LABEL_TEMPLATE_HASH):
        return False
    owners = {ref.get("uid") for ref in meta.get("ownerReferences") or () if ref.get("controller")}
    return owners == {ref.get("uid") for ref in want.get("ownerReferences") or ()}


def read_probe_target(job: Mapping[str, Any]) -> ProbeTarget | None:
    """The artifact a probe Job was created for, from its annotations (None if not ours)."""
    notes = job.get("metadata", {}).get("annotations") or {}
    try:
        return ProbeTarget(
            rel_path=notes[names.ANNOTATION_ARTIFACT_PATH],
            size=int(notes[names.ANNOTATION_ARTIFACT_SIZE]),
            cache_digest=notes.get(names.ANNOTATION_CACHE_DIGEST) or None,
        )
    except (KeyError, ValueError):
        return None


# --- the manifest -------------------------------------------------------------------------------


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _resources(probe: ProbeSpec, settings: ProbePodSettings) -> dict[str, dict[str, str]]:
    """The bundle's requests and limits over the operator's defaults.

    When one side comes from the bundle and the other from the defaults and they cross
    (request above limit, which the apiserver refuses), the default side follows the bundle's.
    Both set by the bundle and crossing is refused earlier, by the spec model.
    """
    own_requests = _quantities(probe.resources.requests)
    own_limits = _quantities(probe.resources.limits)
    requests = {**settings.default_requests, **own_requests}
    limits = {**settings.default_limits, **own_limits}
    for name in requests.keys() & limits.keys():
        if quantity_value(requests[name]) > quantity_value(limits[name]):
            if name in own_limits:
                requests[name] = limits[name]
            else:
                limits[name] = requests[name]
    return {"requests": requests, "limits": limits}


def _quantities(entries: Mapping[str, int | str]) -> dict[str, str]:
    return {k: str(v) for k, v in entries.items()}


def _container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def active_deadline_seconds(request: ProbeJobRequest) -> int:
    """The Job's deadline: download, connect, answer, exit grace and a scheduling allowance."""
    answer = parse_duration(request.probe.timeout).total_seconds()
    total = (
        request.settings.fetch_timeout_seconds
        + DRIVER_CONNECT_SECONDS
        + answer
        + DRIVER_EXIT_GRACE_SECONDS
        + request.settings.deadline_allowance_seconds
    )
    return math.ceil(total)


def fetch_command(request: ProbeJobRequest) -> list[str]:
    manifest = json.dumps(
        [f.to_manifest() for f in request.files], separators=(",", ":"), sort_keys=True
    )
    return [
        "taskhandler-operator",
        "fetch",
        "--dest",
        BUNDLE_MOUNT,
        "--manifest",
        manifest,
        "--timeout",
        str(request.settings.fetch_timeout_seconds),
        "--max-bytes",
        str(sum(f.size for f in request.files)),
    ]


def probe_command(request: ProbeJobRequest) -> list[str]:
    answer = parse_duration(request.probe.timeout).total_seconds()
    return [
        "taskhandler-operator",
        "probe",
        f"{BUNDLE_MOUNT}/{request.target.rel_path}",
        "--language",
        request.language.value,
        "--bundle-root",
        BUNDLE_MOUNT,
        "--bundle-name",
        request.bundle.bundle_name,
        "--timeout",
        _seconds(answer),
        *(arg for dag_id in request.dag_ids or () for arg in ("--dag-id", dag_id)),
    ]


def _validate(request: ProbeJobRequest) -> None:
    rel = request.target.rel_path
    if not rel or rel.startswith("/") or ".." in rel.split("/"):
        raise ValueError(f"artifact path must be relative and stay inside the bundle: {rel!r}")
    paths = [f.path for f in request.files]
    if rel not in paths:
        raise ValueError(f"the files to fetch do not include the artifact {rel!r}")
    if len(set(paths)) != len(paths):
        raise ValueError("the files to fetch name one path twice")


def template_hash(request: ProbeJobRequest) -> str:
    """The hash of everything that shapes the probe's pod: the Job spec (images, commands,
    resources, deadlines, scheduling, security) as :func:`build_probe_job` renders it, with the
    download URLs left out. The URLs are signed afresh on every pass (they expire), while what
    they name is pinned by each file's path, size and sha256, which stay in."""
    unsigned = [dataclasses.replace(f, url="") for f in request.files]
    spec = _job_spec(dataclasses.replace(request, files=tuple(unsigned)), {})
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:TEMPLATE_HASH_CHARS]


def build_probe_job(request: ProbeJobRequest) -> dict[str, Any]:
    """The ``batch/v1`` Job manifest probing ``request.target`` (``ValueError`` on bad input)."""
    _validate(request)
    template = template_hash(request)
    labels = probe_job_labels(request.bundle)
    bundle = request.bundle
    annotations = {
        names.ANNOTATION_ARTIFACT_PATH: request.target.rel_path,
        names.ANNOTATION_ARTIFACT_SIZE: str(request.target.size),
    }
    if request.target.cache_digest:
        annotations[names.ANNOTATION_CACHE_DIGEST] = request.target.cache_digest
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": probe_job_name(bundle, request.target, template),
            "namespace": bundle.namespace,
            # The hash of the template the Job was built from, checked on adoption.
            "labels": {**labels, names.LABEL_TEMPLATE_HASH: template},
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": names.API_VERSION,
                    "kind": names.KIND,
                    "name": bundle.name,
                    "uid": bundle.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": _job_spec(request, labels),
    }


def _job_spec(request: ProbeJobRequest, labels: Mapping[str, str]) -> dict[str, Any]:
    settings = request.settings
    resources = _resources(request.probe, settings)
    total_bytes = sum(f.size for f in request.files)
    bundle_limit = math.ceil((total_bytes + settings.bundle_headroom_bytes) / MIB)
    pull = {"imagePullPolicy": settings.image_pull_policy} if settings.image_pull_policy else {}
    bundle_rw = {"name": "bundle", "mountPath": BUNDLE_MOUNT}
    tmp = {"name": "tmp", "mountPath": TMP_MOUNT}

    fetch = {
        "name": FETCH_CONTAINER,
        "image": request.operator_image,
        **pull,
        "command": fetch_command(request),
        "workingDir": TMP_MOUNT,
        "env": [{"name": "HOME", "value": TMP_MOUNT}, {"name": "TMPDIR", "value": TMP_MOUNT}],
        "resources": resources,
        "securityContext": _container_security(),
        "volumeMounts": [bundle_rw, tmp],
        # fetch reports on stderr: its last lines become the message when it fails.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    probe = {
        "name": PROBE_CONTAINER,
        "image": request.runtime_image,
        **pull,
        "command": probe_command(request),
        "workingDir": TMP_MOUNT,
        "env": [{"name": "HOME", "value": TMP_MOUNT}, {"name": "TMPDIR", "value": TMP_MOUNT}],
        "resources": resources,
        "securityContext": _container_security(),
        # The runtime reads the bundle; only the init container writes it.
        "volumeMounts": [{**bundle_rw, "readOnly": True}, tmp],
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": settings.service_account,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": settings.run_as_user,
            "runAsGroup": settings.run_as_group,
            "fsGroup": settings.fs_group,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "initContainers": [fetch],
        "containers": [probe],
        "volumes": [
            {"name": "bundle", "emptyDir": {"sizeLimit": f"{bundle_limit}Mi"}},
            {"name": "tmp", "emptyDir": {"sizeLimit": settings.tmp_size_limit}},
        ],
    }
    if request.probe.node_selector:
        pod_spec["nodeSelector"] = dict(request.probe.node_selector)
    if request.probe.tolerations:
        pod_spec["tolerations"] = [
            t.model_dump(by_alias=True, exclude_none=True) for t in request.probe.tolerations
        ]
    return {
        "backoffLimit": 0,
        "activeDeadlineSeconds": active_deadline_seconds(request),
        "ttlSecondsAfterFinished": settings.ttl_seconds_after_finished,
        "template": {
            "metadata": {
                "labels": dict(labels),
                "annotations": {"kubectl.kubernetes.io/default-container": PROBE_CONTAINER},
            },
            "spec": pod_spec,
        },
    }


# --- reading a Job back -------------------------------------------------------------------------


def _pick(obj: Mapping[str, Any] | None, *keys: str) -> dict[str, Any]:
    return {k: obj[k] for k in keys if obj and obj.get(k) is not None}


def job_view(job: Mapping[str, Any]) -> dict[str, Any]:
    """What :func:`job_outcome` reads of a Job, and nothing else (the watch index keeps this per
    probe Job, not the whole object with its pod template and managed fields)."""
    meta = job.get("metadata") or {}
    status = job.get("status") or {}
    return {
        "metadata": _pick(meta, "name", "namespace", "uid", "labels", "deletionTimestamp"),
        "spec": _pick(job.get("spec"), "activeDeadlineSeconds"),
        "status": {
            "conditions": [
                _pick(c, "type", "status", "reason", "message")
                for c in status.get("conditions") or ()
            ],
            **_pick(status, "active", "succeeded", "failed"),
        },
    }


def pod_job_name(pod: Mapping[str, Any]) -> str | None:
    """The Job a pod belongs to (the Job controller's label), None for any other pod."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    name = labels.get("batch.kubernetes.io/job-name") or labels.get("job-name")
    return str(name) if name else None


def pod_view(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What :func:`job_outcome` reads of a probe pod: its containers' states and the probe
    container's memory limit, its conditions, phase and reason, deletion and creation times."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    containers = [
        {
            "name": c.get("name"),
            "resources": {"limits": _pick(c.get("resources", {}).get("limits"), "memory")},
        }
        for c in (pod.get("spec") or {}).get("containers") or ()
        if c.get("name") == PROBE_CONTAINER
    ]

    def statuses(key: str) -> list[dict[str, Any]]:
        return [_pick(c, "name", "state") for c in status.get(key) or ()]

    return {
        "metadata": _pick(meta, "name", "namespace", "creationTimestamp", "deletionTimestamp"),
        "spec": {"containers": containers},
        "status": {
            **_pick(status, "phase", "reason", "message"),
            "conditions": [
                _pick(c, "type", "status", "reason", "message")
                for c in status.get("conditions") or ()
            ],
            "initContainerStatuses": statuses("initContainerStatuses"),
            "containerStatuses": statuses("containerStatuses"),
        },
    }


def pod_settled(job: Mapping[str, Any], pod: Mapping[str, Any] | None) -> bool:
    """Whether ``pod`` as seen can explain the finished ``job``: the pod has ended (Succeeded or
    Failed), or the Job failed on its deadline (its pod is then deleted, never ended). The
    Job and Pod watches are separate streams, so the Job's end can arrive before its pod's."""
    failed = _condition(job, "Failed", "FailureTarget")
    if failed is not None and failed.get("reason") == "DeadlineExceeded":
        return True
    phase = ((pod or {}).get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed")


class ProbePhase(StrEnum):
    RUNNING = "Running"  # not finished (pending, fetching or probing)
    SUCCEEDED = "Succeeded"  # the probe container exited 0 with a summary: check it with the log
    FAILED = "Failed"  # the artifact has no answer at this revision; ``reason`` says why


class ProbeFailure(StrEnum):
    """Why a probe Job gave no answer (the artifact's reason in status and events)."""

    ARTIFACT_REFUSED = "ArtifactRefused"  # driver exit 3: verification failed, nothing ran
    RUNTIME_FAILED = "RuntimeFailed"  # driver exit 1: the runtime misbehaved or did not answer
    DRIVER_ERROR = "ProbeDriverError"  # driver exit 4: the runtime could not be launched
    PROBE_CRASHED = "ProbeCrashed"  # another exit code or a signal: the container itself died
    OUT_OF_MEMORY = "OutOfMemory"  # OOMKilled at the memory limit
    DEADLINE_EXCEEDED = "DeadlineExceeded"  # activeDeadlineSeconds passed
    EVICTED = "Evicted"  # the node evicted the pod (disk or memory pressure)
    FETCH_FAILED = "FetchFailed"  # the init container could not download or verify the files
    POD_LOST = "PodLost"  # its pod is gone, or was deleted or disrupted mid-probe
    JOB_DELETED = "JobDeleted"  # the Job disappeared before its result was read
    INVALID_SUMMARY = "InvalidSummary"  # exit 0 but the termination message is not a summary
    RESULT_REJECTED = "ResultRejected"  # the log's result does not match the summary's sha256
    ARTIFACT_UNAVAILABLE = "ArtifactUnavailable"  # the operator cannot serve it: no Job created
    NO_PROBE_IMAGE = "NoProbeImage"  # no image runs the bundle's language: no Job was created
    PROBE_FAILED = "ProbeFailed"  # no finer reason, e.g. an answer the database cannot store
    # Not the artifact's fault, retried after the probe back-off:
    TRANSIENT_API_ERROR = "TransientApiError"  # the apiserver or kubelet failed (5xx, 429, down)
    LOG_UNREADABLE = "ProbeLogUnreadable"  # the log was refused for good (e.g. RBAC): no answer
    JOB_CONFLICT = "ProbeJobConflict"  # a Job of that name exists but another template built it


@dataclass(frozen=True)
class ProbeJobOutcome:
    phase: ProbePhase
    reason: str
    message: str
    summary: ProbeSummary | None = None
    """The probe container's summary (termination message), when it wrote a valid one."""

    @property
    def finished(self) -> bool:
        return self.phase is not ProbePhase.RUNNING


_EXIT_REASONS = {
    ExitCode.ARTIFACT_REFUSED: (ProbeFailure.ARTIFACT_REFUSED, "the artifact was refused"),
    ExitCode.PROBE_FAILED: (ProbeFailure.RUNTIME_FAILED, "the runtime failed the probe"),
    ExitCode.DRIVER_ERROR: (
        ProbeFailure.DRIVER_ERROR,
        "the probe driver could not run the artifact",
    ),
}


def _condition(obj: Mapping[str, Any], *types: str) -> Mapping[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or ():
        if cond.get("type") in types and cond.get("status") == "True":
            return dict(cond)
    return None


def _container_status(
    pod: Mapping[str, Any] | None, name: str, init: bool = False
) -> Mapping[str, Any]:
    if pod is None:
        return {}
    key = "initContainerStatuses" if init else "containerStatuses"
    for status in (pod.get("status") or {}).get(key) or ():
        if status.get("name") == name:
            return dict(status)
    return {}


def _memory_limit(pod: Mapping[str, Any] | None) -> str | None:
    for container in ((pod or {}).get("spec") or {}).get("containers") or ():
        if container.get("name") == PROBE_CONTAINER:
            limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
            return str(limit) if limit is not None else None
    return None


def _summary(text: str | None) -> ProbeSummary | None:
    if not text:
        return None
    try:
        return ProbeSummary.model_validate_json(text)
    except ValidationError:
        return None


def _taken_away(pod: Mapping[str, Any] | None) -> str | None:
    """How the pod was taken away while it ran (deleted, or disrupted: preempted, its node
    gone), in words; None when nothing from outside ended it."""
    if pod is None:
        return None
    disruption = _condition(pod, "DisruptionTarget")
    if disruption is not None:
        return f"disrupted ({disruption.get('reason') or 'DisruptionTarget'})"
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "deleted"
    return None


def _last_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _failed(reason: ProbeFailure, message: str, log_tail: str | None) -> ProbeJobOutcome:
    last = _last_line(log_tail)[:MAX_LOG_LINE_CHARS]
    if last and last not in message:
        message = f"{message}; last log line: {last}"
    return ProbeJobOutcome(ProbePhase.FAILED, reason.value, message)


def _running(pod: Mapping[str, Any] | None) -> ProbeJobOutcome:
    """Where an unfinished probe is: no pod yet, unschedulable, waiting, fetching, probing."""

    def running(reason: str, message: str) -> ProbeJobOutcome:
        return ProbeJobOutcome(ProbePhase.RUNNING, reason, message)

    if pod is None:
        return running("Pending", "waiting for the probe pod")
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            why = cond.get("message") or "no node fits"
            reason = str(cond.get("reason") or "Unschedulable")
            return running(reason, f"the probe pod cannot be scheduled: {why}")
    for name, init in ((FETCH_CONTAINER, True), (PROBE_CONTAINER, False)):
        state = _container_status(pod, name, init).get("state") or {}
        waiting = state.get("waiting") or {}
        if waiting.get("reason") not in (None, "PodInitializing", "ContainerCreating"):
            detail = f": {waiting['message']}" if waiting.get("message") else ""
            return running(str(waiting["reason"]), f"the {name} container is waiting{detail}")
        if "running" in state:
            if init:
                return running("Fetching", "downloading the artifact")
            return running("Probing", "the probe is running")
    return running("Pending", "the probe pod is starting")


def job_outcome(
    job: Mapping[str, Any] | None,
    pod: Mapping[str, Any] | None,
    log_tail: str | None = None,
) -> ProbeJobOutcome:
    """What a probe Job says about its artifact.

    ``job`` and ``pod`` are the objects as the API returns them (camelCase JSON; ``pod`` is the
    Job's pod, or None when there is none); ``log_tail`` is the end of the probe container's
    log, quoted in a failure's message. A finished probe is ``SUCCEEDED`` with its summary (the
    caller accepts the result only when the log's result matches it) or ``FAILED``.
    """
    if job is None:
        return _failed(
            ProbeFailure.JOB_DELETED,
            "the probe Job was deleted before its result was read; it will be probed again",
            None,
        )
    failed = _condition(job, "Failed", "FailureTarget")
    done = _condition(job, "Complete", "SuccessCriteriaMet")
    if failed is None and done is None:
        return _running(pod)

    probe = (_container_status(pod, PROBE_CONTAINER).get("state") or {}).get("terminated")
    fetch = (_container_status(pod, FETCH_CONTAINER, init=True).get("state") or {}).get(
        "terminated"
    )
    if failed is None:
        if probe is None:
            return _failed(
                ProbeFailure.POD_LOST,
                "the probe Job finished but its pod is gone, so its result cannot be read; "
                "it will be probed again",
                None,
            )
        summary = _summary(probe.get("message"))
        if probe.get("exitCode") == 0 and summary is not None and summary.ok:
            return ProbeJobOutcome(ProbePhase.SUCCEEDED, "Succeeded", "probed", summary)
        return _failed(
            ProbeFailure.INVALID_SUMMARY,
            "the probe exited 0 but its termination message is not a valid summary",
            log_tail,
        )

    deadline = (job.get("spec") or {}).get("activeDeadlineSeconds")
    pod_reason = ((pod or {}).get("status") or {}).get("reason")
    if failed.get("reason") == "DeadlineExceeded" or pod_reason == "DeadlineExceeded":
        where = "downloading the artifact" if probe is None and fetch is None else "probing"
        return _failed(
            ProbeFailure.DEADLINE_EXCEEDED,
            f"the probe did not finish within its deadline of {deadline}s (stopped while "
            f"{where}); raise spec.probe.timeout if the runtime needs longer to answer",
            log_tail,
        )
    if pod_reason == "Evicted":
        message = ((pod or {}).get("status") or {}).get("message") or "no message"
        return _failed(ProbeFailure.EVICTED, f"the probe pod was evicted: {message}", log_tail)
    lost = _taken_away(pod)
    if lost is not None and (probe is None or probe.get("exitCode") != 0):
        # Its end came from outside (kubectl delete, a lost node): nothing about the artifact.
        return _failed(
            ProbeFailure.POD_LOST,
            f"the probe pod was {lost} before the probe finished; it will be probed again",
            None,
        )
    if fetch is not None and fetch.get("exitCode") != 0:
        if fetch.get("reason") == "OOMKilled":
            # Both containers share the limit; the download is the first to meet it (seen on a
            # real kubelet: a limit too small for the probe kills the fetch container first).
            return _failed(
                ProbeFailure.OUT_OF_MEMORY,
                f"the probe ran out of memory while downloading the artifact (limit "
                f"{_memory_limit(pod) or 'unknown'}); raise spec.probe.resources.limits.memory",
                log_tail,
            )
        detail = _last_line(fetch.get("message")) or f"exit code {fetch.get('exitCode')}"
        return _failed(
            ProbeFailure.FETCH_FAILED,
            f"downloading the artifact into the probe pod failed: {detail}",
            None,
        )
    if probe is None:
        cond = f"{failed.get('reason', '')}: {failed.get('message', '')}".strip(": ")
        return _failed(
            ProbeFailure.POD_LOST,
            f"the probe Job failed ({cond or 'no reason given'}) before the probe ran",
            log_tail,
        )
    if probe.get("reason") == "OOMKilled":
        limit = _memory_limit(pod)
        return _failed(
            ProbeFailure.OUT_OF_MEMORY,
            f"the probe ran out of memory (limit {limit or 'unknown'}); raise "
            "spec.probe.resources.limits.memory",
            log_tail,
        )
    return _exit_outcome(probe, log_tail)


def _exit_outcome(probe: Mapping[str, Any], log_tail: str | None) -> ProbeJobOutcome:
    code = probe.get("exitCode")
    summary = _summary(probe.get("message"))
    try:
        known = ExitCode(code) if isinstance(code, int) else None
    except ValueError:
        known = None
    if known is not None and known in _EXIT_REASONS:
        reason, lead = _EXIT_REASONS[known]
        detail = ""
        if summary is not None and summary.error:
            kind = f" ({summary.error_kind})" if summary.error_kind else ""
            detail = f"{kind}: {summary.error}"
        outcome = _failed(reason, f"{lead}{detail}", log_tail)
        return ProbeJobOutcome(outcome.phase, outcome.reason, outcome.message, summary)
    signal = f", signal {probe['signal']}" if probe.get("signal") else ""
    why = probe.get("reason") or "no reason"
    text = _last_line(probe.get("message"))
    message = f"the probe container exited with code {code} ({why}{signal})"
    return _failed(ProbeFailure.PROBE_CRASHED, f"{message}: {text}" if text else message, log_tail)

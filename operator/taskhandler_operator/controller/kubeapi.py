"""The operator's Kubernetes calls, async, over the official ``kubernetes`` client.

Why this shape:

* The official client is synchronous. Every call runs on a dedicated, bounded
  ``ThreadPoolExecutor`` owned by one :class:`KubeApi` (never the loop's default executor, which
  kopf also uses), with the caller's context variables (log context) copied into the thread.
  The leader elector gets its own :class:`KubeApi`, so a burst of reconcile calls can never
  delay a Lease renewal.
* Objects go in and come out as plain dicts, exactly as the API serves them (camelCase), like
  the bodies kopf hands to handlers. Requests are built with the client's ``ApiClient``
  (kubeconfig or in-cluster config, auth, TLS, connection pool) but skip its generated model
  layer: that round trip serialises a ``MicroTime`` (Lease ``renewTime``, Event ``eventTime``)
  whose microseconds are zero without a fraction, which the apiserver refuses (measured on
  1.37: "cannot parse '+00:00' as '.000000'"), and it would drop fields a model lacks.
* Every call has a timeout (``request_timeout``), so a hung connection frees its thread.

Errors (one line each, naming the operation and the object)::

    KubeApiError               .status (HTTP, 0 when no answer), .reason, .retryable
    ├── ApiUnavailable         no answer, timeout, 429, 5xx: retry with back-off
    ├── ApiRefused             400/401/403/405/413/415/422 and other 4xx: retrying will not help
    ├── NotFound               404: the object (or its namespace) does not exist
    └── Conflict               409: resourceVersion precondition failed (re-read and retry),
                               or ``reason == "AlreadyExists"`` on create
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextvars
import functools
import itertools
import json
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar, cast

import urllib3
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from taskhandler_operator.controller.logs import Redactor

Obj = dict[str, Any]
T = TypeVar("T")

REPORTING_CONTROLLER = "taskhandler-operator"
FIELD_MANAGER = "taskhandler-operator"
_MANAGER: list[tuple[str, Any]] = [("fieldManager", FIELD_MANAGER)]  # names our writes
DEFAULT_LOG_LIMIT = 256 * 1024
STREAM_CHUNK = 64 * 1024
#: Asks a LIST for the objects' metadata only (the apiserver's PartialObjectMetadataList).
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json"
EVENT_NOTE_LIMIT = 1024  # events.k8s.io/v1 refuses a longer note
EVENT_FIELD_LIMIT = 128  # reason, action, reportingInstance


# --- errors ----------------------------------------------------------------------------------


class KubeApiError(Exception):
    retryable = False

    def __init__(self, message: str, *, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class ApiUnavailable(KubeApiError):
    """The apiserver did not answer, timed out, throttled (429) or failed (5xx)."""

    retryable = True


class ApiRefused(KubeApiError):
    """The apiserver refused the request for good (bad request, forbidden, invalid)."""


class NotFound(KubeApiError):
    """The object does not exist."""


class Conflict(KubeApiError):
    """409: a precondition failed (someone else wrote first) or the object already exists."""

    retryable = True


def _status_message(exc: ApiException) -> tuple[str, str]:
    """(message, reason) from the apiserver's Status body, falling back to the HTTP reason."""
    body = exc.body
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str) and body:
        try:
            status = json.loads(body)
        except ValueError:
            status = None
        if isinstance(status, dict) and status.get("message"):
            return str(status["message"]), str(status.get("reason") or "")
    return str(exc.reason or "no response").strip().splitlines()[0], ""


def classify(what: str, exc: BaseException) -> KubeApiError:
    """The typed error for a failed call; ``what`` names the operation ("read Secret ns/x")."""
    if isinstance(exc, KubeApiError):
        return exc
    if isinstance(exc, ApiException):
        code = int(exc.status or 0)
        message, reason = _status_message(exc)
        text = f"{what}: {message}"
        if code == 0 or code == 429 or code >= 500:
            return ApiUnavailable(text, status=code, reason=reason)
        if code == 404:
            return NotFound(text, status=code, reason=reason or "NotFound")
        if code == 409:
            return Conflict(text, status=code, reason=reason or "Conflict")
        return ApiRefused(text, status=code, reason=reason)
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError | TimeoutError):
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return ApiUnavailable(f"{what}: apiserver unavailable: {detail}")
    raise TypeError(f"not an API failure: {exc!r}") from exc


# --- resources -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CustomResource:
    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def path(self, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
        path = f"/apis/{self.group}/{self.version}/namespaces/{_q(namespace)}/{self.plural}"
        if name is not None:
            path += f"/{_q(name)}"
        if subresource is not None:
            path += f"/{subresource}"
        return path


BUNDLES = CustomResource("langsdk.dev", "v1alpha1", "taskhandlerbundles", "TaskHandlerBundle")


def _q(segment: str) -> str:
    if not segment or "/" in segment:
        raise ValueError(f"not a valid object or namespace name: {segment!r}")
    return urllib.parse.quote(segment, safe="")


def micro_time(moment: datetime | None = None) -> str:
    """A ``MicroTime`` as the apiserver parses it: always six fraction digits, UTC."""
    moment = (moment or datetime.now(UTC)).astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def merge_patch_to(old: Any, new: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns ``old`` into exactly ``new``.

    A plain merge patch of the new status would keep keys the new status no longer has; this
    sets them to null, so "status rewritten whole each pass" holds without a PUT (which would
    need the object's resourceVersion and fail on every concurrent spec change).
    """
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch: Obj = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        elif old[key] != value:
            patch[key] = merge_patch_to(old[key], value)
    return patch


@dataclass(frozen=True)
class JobCreated:
    job: Obj
    created: bool
    """False when a Job of that name existed already and was adopted (read back as it is)."""


@dataclass(frozen=True)
class LogText:
    text: str
    truncated: bool


# --- the client ------------------------------------------------------------------------------


class KubeApi:
    """Async calls the operator needs, each run on this instance's bounded executor."""

    def __init__(
        self,
        api_client: ApiClient,
        *,
        max_workers: int = 4,
        request_timeout: float = 30.0,
        reporting_instance: str = REPORTING_CONTROLLER,
        redactor: Redactor | None = None,
        event_dedupe_window: float = 3600.0,
        event_dedupe_size: int = 4096,
        clock: Callable[[], float] = time.monotonic,
        thread_name: str = "kubeapi",
        stream_workers: int = 4,
    ) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        self.api_client = api_client
        self.request_timeout = request_timeout
        self.reporting_instance = reporting_instance[:EVENT_FIELD_LIMIT]
        self.redactor = redactor
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=thread_name)
        # Log streams hold a thread for as long as a log takes to read: their own pool, so
        # status writes and Events never queue behind them.
        self._streams = ThreadPoolExecutor(
            max_workers=max(1, stream_workers), thread_name_prefix=f"{thread_name}-logs"
        )
        # Events: (object, type, reason, note) -> when posted. The apiserver keeps Events for an
        # hour by default, so within that window the earlier Event is still on the object.
        self._posted: OrderedDict[tuple[str, ...], float] = OrderedDict()
        self._dedupe_window = event_dedupe_window
        self._dedupe_size = event_dedupe_size
        self._clock = clock
        self._event_seq = itertools.count()

    async def aclose(self) -> None:
        """Stop the executor (waiting for calls in flight); the ApiClient stays the caller's."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._executor.shutdown)
        await loop.run_in_executor(None, self._streams.shutdown)

    # --- transport ---------------------------------------------------------------------------

    async def _run(self, func: Callable[[], T], executor: ThreadPoolExecutor | None = None) -> T:
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        return await loop.run_in_executor(
            executor or self._executor, functools.partial(context.run, func)
        )

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, Any]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | tuple[float, float] | None = None,
        read_limit: int | None = None,
        consume: Callable[[bytes], None] | None = None,
        accept: str = "application/json, */*",
    ) -> bytes:
        """One HTTP request in this thread; the response body, or ApiException for non-2xx.

        With ``consume``, the body (at most ``read_limit`` bytes) is handed to it in chunks as
        it arrives and not kept: the return value is then empty."""
        headers = {"Accept": accept, "Content-Type": content_type}
        method, url, headers, serialized, _ = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or None,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api_client.call_api(
            method,
            url,
            header_params=headers,
            body=serialized,
            _request_timeout=timeout or self.request_timeout,
        )
        raw = response.response
        complete = False
        try:
            if not 200 <= response.status < 300:
                data = raw.read(64 * 1024)
                raise ApiException(
                    status=response.status,
                    reason=response.reason,
                    body=data.decode("utf-8", "replace"),
                )
            if consume is not None:
                left = read_limit
                while left is None or left > 0:
                    chunk = raw.read(STREAM_CHUNK if left is None else min(STREAM_CHUNK, left))
                    if not chunk:
                        complete = True
                        break
                    consume(bytes(chunk))
                    if left is not None:
                        left -= len(chunk)
                return b""
            if read_limit is None:
                data = raw.read()
                complete = True
            else:
                data = raw.read(read_limit)
            return bytes(data)
        finally:
            # A body not read to its end leaves the connection unusable for the next request.
            if complete:
                raw.release_conn()
            else:
                raw.close()

    async def request(
        self,
        what: str,
        method: str,
        path: str,
        **kwargs: Any,
    ) -> bytes:
        try:
            return await self._run(functools.partial(self._send, method, path, **kwargs))
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise classify(what, exc) from exc

    async def request_json(self, what: str, method: str, path: str, **kwargs: Any) -> Obj:
        data = await self.request(what, method, path, **kwargs)
        try:
            parsed = json.loads(data)
        except ValueError as exc:
            raise ApiUnavailable(f"{what}: the apiserver answered with no JSON object") from exc
        if not isinstance(parsed, dict):
            raise ApiUnavailable(f"{what}: the apiserver answered with no JSON object")
        return parsed

    async def _list(
        self,
        what: str,
        path: str,
        label_selector: str | None,
        page: int = 500,
        accept: str | None = None,
    ) -> list[Obj]:
        items: list[Obj] = []
        token: str | None = None
        extra: dict[str, Any] = {} if accept is None else {"accept": accept}
        while True:
            query: list[tuple[str, Any]] = [("limit", page)]
            if label_selector:
                query.append(("labelSelector", label_selector))
            if token:
                query.append(("continue", token))
            listing = await self.request_json(what, "GET", path, query=query, **extra)
            items.extend(listing.get("items") or [])
            token = (listing.get("metadata") or {}).get("continue")
            if not token:
                return items

    # --- TaskHandlerBundle ---------------------------------------------------------------------

    async def get_bundle(
        self, namespace: str, name: str, resource: CustomResource = BUNDLES
    ) -> Obj:
        what = f"read {resource.kind} {namespace}/{name}"
        return await self.request_json(what, "GET", resource.path(namespace, name))

    async def list_bundle_keys(
        self, namespace: str | None, label_selector: str, resource: CustomResource = BUNDLES
    ) -> set[tuple[str, str]]:
        """(namespace, name) of the bundles matching ``label_selector``, in ``namespace`` or
        (None) in every namespace: one paginated LIST of their metadata only
        (PartialObjectMetadataList), so neither spec nor status crosses the wire."""
        where = namespace or "every namespace"
        if namespace is None:
            path = f"/apis/{resource.group}/{resource.version}/{resource.plural}"
        else:
            path = resource.path(namespace)
        items = await self._list(
            f"list {resource.kind}s in {where} ({label_selector})",
            path,
            label_selector,
            accept=METADATA_LIST,
        )
        keys: set[tuple[str, str]] = set()
        for item in items:
            meta = item.get("metadata") or {}
            if meta.get("namespace") and meta.get("name"):
                keys.add((str(meta["namespace"]), str(meta["name"])))
        return keys

    async def patch_bundle_status(
        self,
        namespace: str,
        name: str,
        status: Obj,
        *,
        previous: Obj | None = None,
        resource_version: str | None = None,
        resource: CustomResource = BUNDLES,
    ) -> Obj:
        """Merge-patch the status subresource; returns the object as stored.

        With ``previous`` (the status last read), keys it has and ``status`` lacks are
        removed, so the stored status equals ``status``. With ``resource_version`` the write
        only happens if nobody changed the object since (else :class:`Conflict`).
        """
        patch: Obj = {"status": status if previous is None else merge_patch_to(previous, status)}
        if resource_version is not None:
            patch["metadata"] = {"resourceVersion": resource_version}
        return await self.request_json(
            f"patch status of {resource.kind} {namespace}/{name}",
            "PATCH",
            resource.path(namespace, name, "status"),
            query=_MANAGER,
            body=patch,
            content_type="application/merge-patch+json",
        )

    # --- Jobs and Pods -------------------------------------------------------------------------

    async def list_jobs(self, namespace: str, label_selector: str) -> list[Obj]:
        path = f"/apis/batch/v1/namespaces/{_q(namespace)}/jobs"
        return await self._list(
            f"list Jobs in {namespace} ({label_selector})", path, label_selector
        )

    async def get_job(self, namespace: str, name: str) -> Obj:
        path = f"/apis/batch/v1/namespaces/{_q(namespace)}/jobs/{_q(name)}"
        return await self.request_json(f"read Job {namespace}/{name}", "GET", path)

    async def create_job(self, namespace: str, manifest: Obj) -> JobCreated:
        """Create the Job, or adopt the one that already has its (deterministic) name.

        A restarted operator asks again for the Jobs it created before it died; the
        apiserver's AlreadyExists is the answer "it is running already" and the existing Job
        is returned as it is (its status tells whether it finished). If it vanishes between
        the 409 and the read (its TTL ran out), the create is tried once more.
        """
        name = (manifest.get("metadata") or {}).get("name")
        if not isinstance(name, str) or not name:
            raise ValueError("a probe Job needs metadata.name (deterministic names make adoption)")
        path = f"/apis/batch/v1/namespaces/{_q(namespace)}/jobs"
        what = f"create Job {namespace}/{name}"
        for _ in range(2):
            try:
                job = await self.request_json(what, "POST", path, query=_MANAGER, body=manifest)
                return JobCreated(job, created=True)
            except Conflict as exc:
                if exc.reason != "AlreadyExists":
                    raise
            try:
                return JobCreated(await self.get_job(namespace, name), created=False)
            except NotFound:
                continue
        raise ApiUnavailable(f"{what}: the Job kept appearing and disappearing; try again")

    async def delete_job(self, namespace: str, name: str) -> bool:
        """Delete a Job and (in the background) its pods; False when it was gone already."""
        path = f"/apis/batch/v1/namespaces/{_q(namespace)}/jobs/{_q(name)}"
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        try:
            await self.request(f"delete Job {namespace}/{name}", "DELETE", path, body=body)
        except NotFound:
            return False
        return True

    async def list_pods(self, namespace: str, label_selector: str) -> list[Obj]:
        path = f"/api/v1/namespaces/{_q(namespace)}/pods"
        return await self._list(
            f"list Pods in {namespace} ({label_selector})", path, label_selector
        )

    async def get_pod(self, namespace: str, name: str) -> Obj:
        path = f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}"
        return await self.request_json(f"read Pod {namespace}/{name}", "GET", path)

    async def read_container_log(
        self,
        namespace: str,
        pod: str,
        container: str,
        *,
        limit_bytes: int = DEFAULT_LOG_LIMIT,
        tail_lines: int | None = None,
    ) -> LogText:
        """A container's log, at most ``limit_bytes`` (``truncated`` says if there was more).

        The apiserver's ``limitBytes`` is approximate ("slightly more or slightly less"), so
        the bound is also enforced here while reading, and one byte more is asked for to tell
        a log of exactly ``limit_bytes`` from a longer one. Invalid UTF-8 is replaced.
        """
        if limit_bytes < 1:
            raise ValueError(f"limit_bytes must be at least 1, got {limit_bytes}")
        query: list[tuple[str, Any]] = [("container", container), ("limitBytes", limit_bytes + 1)]
        if tail_lines is not None:
            query.append(("tailLines", tail_lines))
        path = f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(pod)}/log"
        what = f"read log of {namespace}/{pod} container {container}"
        data = await self.request(what, "GET", path, query=query, read_limit=limit_bytes + 1)
        truncated = len(data) > limit_bytes
        return LogText(data[:limit_bytes].decode("utf-8", "replace"), truncated)

    async def stream_container_log(
        self,
        namespace: str,
        pod: str,
        container: str,
        consume: Callable[[bytes], None],
        *,
        limit_bytes: int,
    ) -> int:
        """Read a container's log once, handing it to ``consume`` in chunks (in a worker thread)
        without keeping it: memory stays one chunk whatever the log's size. At most
        ``limit_bytes`` are read; returns how many were."""
        if limit_bytes < 1:
            raise ValueError(f"limit_bytes must be at least 1, got {limit_bytes}")
        read = 0

        def counted(chunk: bytes) -> None:
            nonlocal read
            read += len(chunk)
            consume(chunk)

        query: list[tuple[str, Any]] = [("container", container), ("limitBytes", limit_bytes)]
        path = f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(pod)}/log"
        what = f"read log of {namespace}/{pod} container {container}"
        send = functools.partial(
            self._send,
            "GET",
            path,
            query=query,
            read_limit=limit_bytes,
            consume=counted,
            # A big log takes a while: (connect, read) bounds each read, not the whole stream.
            timeout=(self.request_timeout, self.request_timeout),
        )
        try:
            await self._run(send, self._streams)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise classify(what, exc) from exc
        return read

    # --- Secrets -------------------------------------------------------------------------------

    async def read_secret(self, namespace: str, name: str) -> dict[str, bytes]:
        """The Secret's data, decoded. Every value is registered with the redactor first, so
        it never shows up in a log line, whoever logs it later."""
        path = f"/api/v1/namespaces/{_q(namespace)}/secrets/{_q(name)}"
        secret = await self.request_json(f"read Secret {namespace}/{name}", "GET", path)
        data: dict[str, bytes] = {}
        for key, value in (secret.get("data") or {}).items():
            try:
                data[key] = base64.b64decode(value, validate=True)
            except (binascii.Error, TypeError) as exc:
                raise ApiRefused(
                    f"read Secret {namespace}/{name}: key {key!r} is not base64"
                ) from exc
        if self.redactor is not None and data:
            self.redactor.add_credentials(data)
        return data

    # --- Leases --------------------------------------------------------------------------------

    async def get_lease(self, namespace: str, name: str) -> Obj | None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{_q(namespace)}/leases/{_q(name)}"
        try:
            return await self.request_json(f"read Lease {namespace}/{name}", "GET", path)
        except NotFound:
            return None

    async def create_lease(self, namespace: str, lease: Obj) -> Obj:
        name = lease["metadata"]["name"]
        path = f"/apis/coordination.k8s.io/v1/namespaces/{_q(namespace)}/leases"
        what = f"create Lease {namespace}/{name}"
        return await self.request_json(what, "POST", path, query=_MANAGER, body=lease)

    async def replace_lease(self, namespace: str, lease: Obj) -> Obj:
        """PUT the Lease; its ``metadata.resourceVersion`` makes it conditional (409 if stale)."""
        name = lease["metadata"]["name"]
        if not lease["metadata"].get("resourceVersion"):
            raise ValueError("replace_lease needs metadata.resourceVersion (optimistic locking)")
        path = f"/apis/coordination.k8s.io/v1/namespaces/{_q(namespace)}/leases/{_q(name)}"
        what = f"update Lease {namespace}/{name}"
        return await self.request_json(what, "PUT", path, query=_MANAGER, body=lease)

    # --- Events --------------------------------------------------------------------------------

    async def post_event(
        self,
        regarding: Obj,
        *,
        reason: str,
        note: str,
        type: Literal["Normal", "Warning"] = "Normal",  # the API's field name
        action: str = "Reconcile",
    ) -> Obj | None:
        """Post an events.k8s.io/v1 Event about ``regarding`` (an object body or reference).

        Returns None without calling the API when the same (object, type, reason, note) was
        posted by this process within the dedupe window: the Event is still on the object, and
        a reconcile loop that reports the same state every pass must not flood it. The note is
        redacted and cut to the API's 1 kB limit.
        """
        ref = _reference(regarding)
        note = self.redactor(note) if self.redactor is not None else note
        note = _cut(note, EVENT_NOTE_LIMIT)
        reason = _cut(reason, EVENT_FIELD_LIMIT)
        key = (ref.get("uid") or "", ref["namespace"], ref["kind"], ref["name"], type, reason, note)
        now = self._clock()
        posted = self._posted.get(key)
        if posted is not None and now - posted < self._dedupe_window:
            self._posted.move_to_end(key)
            return None
        namespace = ref["namespace"]
        event = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {
                # client-go's naming: object name, then a unique suffix.
                "name": f"{ref['name']}.{time.time_ns():x}{next(self._event_seq):x}",
                "namespace": namespace,
            },
            "eventTime": micro_time(),
            "reportingController": REPORTING_CONTROLLER,
            "reportingInstance": self.reporting_instance,
            "action": _cut(action, EVENT_FIELD_LIMIT),
            "reason": reason,
            "note": note,
            "type": type,
            "regarding": ref,
        }
        path = f"/apis/events.k8s.io/v1/namespaces/{_q(namespace)}/events"
        # Reserve the key before the call, so two passes posting the same Event concurrently
        # post it once; a failed post gives it back.
        self._posted[key] = now
        self._posted.move_to_end(key)
        while len(self._posted) > self._dedupe_size:
            self._posted.popitem(last=False)
        try:
            return await self.request_json(
                f"post Event {reason} on {ref['kind']} {namespace}/{ref['name']}",
                "POST",
                path,
                query=_MANAGER,
                body=event,
            )
        except BaseException:
            if self._posted.get(key) == now:
                del self._posted[key]
            raise

    @property
    def events_remembered(self) -> int:
        """Events in the dedupe memory (bounded; a deleted object's go at once)."""
        return len(self._posted)

    def forget_events(self, namespace: str, name: str) -> None:
        """Drop the dedupe memory of a deleted object."""
        for key in [k for k in self._posted if k[1] == namespace and k[3] == name]:
            del self._posted[key]


def _reference(obj: Obj) -> dict[str, str]:
    """An ObjectReference from a body (``metadata``) or from a reference dict."""
    meta = obj.get("metadata")
    source = cast(Obj, meta) if isinstance(meta, dict) else obj
    ref = {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "namespace": source.get("namespace"),
        "name": source.get("name"),
        "uid": source.get("uid"),
    }
    missing = [k for k in ("apiVersion", "kind", "namespace", "name") if not ref.get(k)]
    if missing:
        raise ValueError(f"an Event needs the object's {', '.join(missing)}")
    return {key: str(value) for key, value in ref.items() if value}


def _cut(text: str, limit: int) -> str:
    """``text`` within ``limit`` UTF-8 bytes, ending in '…' when cut."""
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    return raw[: limit - 3].decode("utf-8", "ignore") + "…"

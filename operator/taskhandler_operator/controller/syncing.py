"""The ``Syncer`` port in a cluster: read the bundle's Secret, then ``sources.sync``.

The Secret named by the source's ``secretRef`` is read by name, in the bundle's namespace, at
every sync (``get`` only: the operator's RBAC grants no ``list``/``watch`` on Secrets), and its
values are registered with the log redactor before anything can print them. A failure becomes a
:class:`SourceSyncFailed` whose ``reason`` is the sources package's CamelCase reason, so the
``SourceReady`` condition says what went wrong (``AuthenticationFailed``, ``NotFound``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

from taskhandler_operator.controller.kubeapi import KubeApi, KubeApiError, NotFound
from taskhandler_operator.kube.conditions import Reason
from taskhandler_operator.reconcile.errors import PassError
from taskhandler_operator.reconcile.models import BundleSpec, SyncedRevision
from taskhandler_operator.sources.access import VolumeAccess
from taskhandler_operator.sources.errors import SourceError
from taskhandler_operator.sources.models import Revision
from taskhandler_operator.sources.spec import SourceSpec
from taskhandler_operator.sources.store import RevisionStore
from taskhandler_operator.sources.sync import sync

__all__ = ["KubeSyncer", "SourceSyncFailed", "airflow_version", "secret_name"]


class SourceSyncFailed(PassError):
    """The sync step failed; ``reason`` is the condition reason, ``kind`` the metric label."""

    component = "source"

    def __init__(self, message: str, *, reason: str, kind: str, retryable: bool) -> None:
        super().__init__("sync", message, reason=reason)
        self.kind = kind
        self.retryable = retryable


def secret_name(source: SourceSpec) -> str | None:
    for kind in (source.git, source.http, source.s3):
        ref = getattr(kind, "secret_ref", None) if kind is not None else None
        if ref is not None:
            return str(ref.name)
    return None


def airflow_version(revision: Revision) -> str:
    """The revision as Airflow's ``dag_bundle.version`` would spell it: a GitDagBundle records
    the bare commit, while our git revision id adds a digest of ``path`` (and ``source`` reads
    ``main@sha1:<commit>``). Other kinds have no versioned Airflow DagBundle: their id."""
    _head, sep, commit = revision.source.rpartition("sha1:")
    if revision.kind == "git" and sep:
        return commit
    return revision.id


def source_kind(source: SourceSpec) -> str:
    for kind in ("git", "http", "s3", "volume"):
        if getattr(source, kind) is not None:
            return kind
    return "unknown"


@dataclass
class KubeSyncer:
    """One bundle's source. ``last`` is the revision the latest successful sync returned."""

    kube: KubeApi
    store: RevisionStore
    namespace: str
    name: str
    source: SourceSpec
    timeout: float
    last: Revision | None = None
    volumes: VolumeAccess | None = None  # where volume sources may read (None: nowhere)

    async def __call__(self, spec: BundleSpec) -> SyncedRevision:
        kind = source_kind(self.source)
        credentials = None
        secret = secret_name(self.source)
        if secret is not None:
            try:
                credentials = await self.kube.read_secret(self.namespace, secret)
            except NotFound:
                raise SourceSyncFailed(
                    f"the Secret {secret!r} named by spec.source.{kind}.secretRef does not exist "
                    f"in namespace {self.namespace}; create it or fix secretRef",
                    reason=Reason.SECRET_NOT_FOUND,
                    kind="secret_not_found",
                    retryable=True,
                ) from None
            except KubeApiError as exc:
                raise SourceSyncFailed(
                    f"cannot read the Secret {secret!r}: {exc}",
                    reason=Reason.SECRET_UNREADABLE,
                    kind="secret_unreadable",
                    retryable=True,
                ) from None
        try:
            revision = await sync(
                self.source,
                credentials,
                self.store,
                namespace=self.namespace,
                bundle=self.name,
                timeout=self.timeout,
                volumes=self.volumes,
            )
        except SourceError as exc:
            raise SourceSyncFailed(
                exc.message,
                reason=exc.reason,
                kind=_snake(exc.reason),
                retryable=not exc.permanent,
            ) from None
        self.last = revision
        return SyncedRevision(revision=revision.id, root=revision.path)


def _snake(reason: str) -> str:
    out = "".join("_" + c.lower() if c.isupper() else c for c in reason).lstrip("_")
    return out[:32] or "unknown"

"""The TaskHandlerBundle status: what the operator observed, rewritten whole each pass.

kstatus conditions (``Ready``, ``Reconciling``, ``Stalled`` and the domain conditions
``SourceReady``, ``ArtifactsProbed``, ``BindingsPublished``), the generation and revisions they
describe, counts, and two bounded lists (artifacts and problems) whose overflow is a count, so
the object stays small however big the bundle is. The full lists live in the database.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_serializer
from pydantic.alias_generators import to_camel

from taskhandler_operator.kube.markers import ListType
from taskhandler_operator.redaction import scrub

__all__ = [
    "MAX_ARTIFACTS",
    "MAX_CONDITION_MESSAGE_CHARS",
    "MAX_ITEM_MESSAGE_CHARS",
    "MAX_PROBLEMS",
    "ArtifactState",
    "ArtifactStatus",
    "ChangeCountsStatus",
    "Condition",
    "ConditionStatus",
    "ConditionType",
    "Counts",
    "PendingChangeStatus",
    "Problem",
    "PublicationStatus",
    "TaskHandlerBundleStatus",
    "bounded",
    "short_revision",
    "shorten",
    "status_artifacts",
    "status_problems",
]

# Bounds of the lists shown in status; what does not fit is counted in *Omitted.
MAX_ARTIFACTS = 50
MAX_PROBLEMS = 20
MAX_CONDITIONS = 16
# The newest publications shown (the history table holds more) and the lines of a held change.
MAX_PUBLICATIONS = 5
MAX_CHANGE_LINES = 5
# Messages are for people reading `kubectl describe`: long enough to name the owner of a
# conflicting claim or a runtime's error, short enough to keep the object small.
MAX_CONDITION_MESSAGE_CHARS = 1024
MAX_ITEM_MESSAGE_CHARS = 512
MAX_PATH_CHARS = 1024
MAX_REASON_CHARS = 128
MAX_QUEUES_CHARS = 1024
# A branch or tag name can be long; the column stays bounded.
MAX_SHORT_REVISION_CHARS = 128
# metav1.Condition's reason grammar (CamelCase, no spaces).
REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
TYPE_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"

T = TypeVar("T")


def shorten(text: str, limit: int, keep_end: bool = False) -> str:
    """``text`` cut to ``limit`` characters with an ellipsis where it was cut (at the start
    with ``keep_end``: the end of a path, its file name, is the informative part)."""
    if len(text) <= limit:
        return text
    return "…" + text[-(limit - 1) :] if keep_end else text[: limit - 1] + "…"


#: Hex digits a short revision keeps, as Flux and ``git log --oneline`` show a commit.
SHORT_DIGEST_CHARS = 8


def short_revision(revision: str, source: str | None = None) -> str:
    """The revision as ``kubectl get`` shows it.

    ``source`` is the source's own spelling of the revision (``main@sha1:<40 hex>`` for a git
    branch or tag, ``sha1:<40 hex>`` for a commit, ``sha256:<64 hex>`` for http (the pinned
    sha256), s3 (the listing digest) and volume (the content digest)); its digest is cut to
    :data:`SHORT_DIGEST_CHARS`: ``main@sha1:1a2b3c4d``, ``sha256:1a2b3c4d``. Without it only the
    revision id is known (``<commit>[-<path digest>]``, ``<sha256>[-<name digest>]``, a
    digest): its first :data:`SHORT_DIGEST_CHARS` characters. The full id stays in
    ``status.revision``.
    """
    if source:
        head, sep, digest = source.rpartition(":")
        if sep and digest:
            return f"{head}:{digest[:SHORT_DIGEST_CHARS]}"
        return source[:MAX_SHORT_REVISION_CHARS]
    return revision[:SHORT_DIGEST_CHARS]


def _fit(limit: int, keep_end: bool = False) -> BeforeValidator:
    # Status is a report: a long text is cut to fit rather than refused. It is scrubbed of
    # credentials first, whole: a credential across the cut must leave no prefix.
    return BeforeValidator(
        lambda v: shorten(scrub(v), limit, keep_end) if isinstance(v, str) else v
    )


ConditionMessage = Annotated[
    str, _fit(MAX_CONDITION_MESSAGE_CHARS), Field(max_length=MAX_CONDITION_MESSAGE_CHARS)
]
ItemMessage = Annotated[str, _fit(MAX_ITEM_MESSAGE_CHARS), Field(max_length=MAX_ITEM_MESSAGE_CHARS)]
PathText = Annotated[str, _fit(MAX_PATH_CHARS, keep_end=True), Field(max_length=MAX_PATH_CHARS)]


def bounded(items: Iterable[T], limit: int) -> tuple[list[T], int]:
    """The first ``limit`` items and how many were left out (the "and N more")."""
    listed = list(items)
    return listed[:limit], max(0, len(listed) - limit)


class _Status(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionType(StrEnum):
    """The condition types this operator writes (kstatus plus three domain conditions)."""

    READY = "Ready"
    RECONCILING = "Reconciling"
    STALLED = "Stalled"
    SOURCE_READY = "SourceReady"
    ARTIFACTS_PROBED = "ArtifactsProbed"
    BINDINGS_PUBLISHED = "BindingsPublished"
    #: Informational (never part of Ready): is Airflow's DagBundle at the published revision?
    DAG_BUNDLE_IN_SYNC = "DagBundleInSync"


class Condition(_Status):
    """One aspect of the bundle's state, in the shape of a Kubernetes metav1.Condition."""

    type: str = Field(
        min_length=1,
        max_length=316,
        pattern=TYPE_PATTERN,
        description="Ready, Reconciling, Stalled, SourceReady, ArtifactsProbed or "
        "BindingsPublished.",
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(
        min_length=1,
        max_length=MAX_REASON_CHARS,
        pattern=REASON_PATTERN,
        description="Why the condition has its status, one CamelCase word (docs/operator.md "
        "lists them).",
    )
    message: ConditionMessage = Field(
        default="", description="What happened and what to do about it, in words."
    )
    last_transition_time: datetime = Field(
        description="When status last changed (a new reason or message alone does not count)."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation the condition was set for."
    )

    @field_serializer("last_transition_time")
    def _rfc3339(self, value: datetime) -> str:
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ArtifactState(StrEnum):
    """Where one candidate artifact stands in the current revision."""

    PENDING = "Pending"  # waiting for a probe slot
    PROBING = "Probing"  # its probe Job runs
    PROBED = "Probed"  # probed at this revision; its answer is used
    CACHED = "Cached"  # an earlier answer for the same content is reused
    REJECTED = "Rejected"  # the reader or the verifier refused the file; never run
    FAILED = "Failed"  # the probe Job failed; the reason says why


class ArtifactStatus(_Status):
    """One artifact of the bundle as the last pass saw it."""

    path: PathText = Field(description="Path of the artifact inside the bundle.")
    state: ArtifactState = Field(
        description="Pending, Probing, Probed, Cached, Rejected or Failed."
    )
    reason: str | None = Field(
        default=None,
        max_length=MAX_REASON_CHARS,
        description="For Rejected and Failed: why, one CamelCase word.",
    )
    message: ItemMessage | None = Field(
        default=None, description="For Rejected and Failed: what went wrong, in words."
    )
    handlers: int | None = Field(
        default=None, ge=0, description="Task handlers the artifact registers."
    )


class Problem(_Status):
    """Something a Dag author or operator must fix: an unbound stub, a conflict, a bad argument."""

    severity: Literal["error", "warning"] = Field(
        description="error: the stub stays unbound (or keeps its old binding); warning: "
        "bound, but worth a look."
    )
    kind: str = Field(
        max_length=64,
        description="unbound, ambiguous, arguments, conflict, unreadable or another kind.",
    )
    dag_id: str | None = Field(default=None, max_length=250, description="The Dag concerned.")
    task_id: str | None = Field(default=None, max_length=250, description="The task concerned.")
    artifact: PathText | None = Field(default=None, description="The artifact concerned.")
    message: ItemMessage = Field(description="The problem and its fix, in words.")


class Counts(_Status):
    """How many of each; the lists below show at most a bounded number."""

    candidates: int = Field(default=0, ge=0, description="Artifacts found in the revision.")
    cached: int = Field(
        default=0, ge=0, description="Artifacts whose earlier answer was reused without a probe."
    )
    probed: int = Field(default=0, ge=0, description="Artifacts probed at this revision.")
    rejected: int = Field(default=0, ge=0, description="Artifacts refused before running.")
    failed: int = Field(default=0, ge=0, description="Artifacts whose probe failed.")
    handlers: int = Field(
        default=0, ge=0, description="Task handlers the bundle's artifacts register."
    )
    bindings: int = Field(
        default=0, ge=0, description="Stub tasks bound to an artifact in Airflow's database."
    )
    unbound_stubs: int = Field(
        default=0,
        ge=0,
        description="Stub tasks on the bundle's queues without a binding (see problems).",
    )


class ChangeCountsStatus(_Status):
    """Bindings a change adds, removes, moves to another artifact or changes in place."""

    added: int = Field(default=0, ge=0, description="Bindings added.")
    removed: int = Field(default=0, ge=0, description="Bindings removed.")
    moved: int = Field(default=0, ge=0, description="Bindings moved to another artifact.")
    changed: int = Field(
        default=0,
        ge=0,
        description="Bindings whose artifact content, binding mode or parameters changed.",
    )


class PublicationStatus(_Status):
    """One recent publication of the bundle's bindings (the history keeps more)."""

    kind: Literal["published", "approved", "rolled_back"] = Field(
        description="published (by a pass), approved (a held change), rolled_back."
    )
    revision: str | None = Field(default=None, max_length=512, description="Source revision.")
    published_at: datetime = Field(description="When it was published.")
    counts: ChangeCountsStatus = Field(default_factory=ChangeCountsStatus)
    approved_by: str | None = Field(
        default=None, max_length=256, description="Who set the approval or rollback annotation."
    )
    change: ItemMessage = Field(default="", description="The change, summarized.")

    @field_serializer("published_at")
    def _rfc3339(self, value: datetime) -> str:
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class PendingChangeStatus(_Status):
    """The change the publish policy holds (or a rollback keeps back)."""

    revision: str | None = Field(default=None, max_length=512, description="Source revision.")
    since: datetime = Field(description="When the change was first held.")
    reason: ItemMessage = Field(default="", description="Why it is held.")
    counts: ChangeCountsStatus = Field(default_factory=ChangeCountsStatus)
    first: list[ItemMessage] = Field(
        default_factory=list,
        max_length=MAX_CHANGE_LINES,
        description=f"The first {MAX_CHANGE_LINES} bindings it changes, one a line "
        "(`taskhandler-operator diff` prints all).",
    )
    omitted: int = Field(default=0, ge=0, description="Changed bindings not listed.")
    refused: ItemMessage | None = Field(
        default=None,
        description="Why the approval annotation set now was refused (it names another revision).",
    )

    @field_serializer("since")
    def _rfc3339(self, value: datetime) -> str:
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class TaskHandlerBundleStatus(_Status):
    """What the operator last observed about this bundle."""

    observed_generation: int | None = Field(
        default=None, description="The metadata.generation the status describes."
    )
    conditions: Annotated[
        list[Condition], Field(max_length=MAX_CONDITIONS), ListType("map", ("type",))
    ] = Field(
        default_factory=list,
        description="Ready, Reconciling and Stalled (kstatus) and SourceReady, "
        "ArtifactsProbed, BindingsPublished.",
    )
    revision: str | None = Field(
        default=None, max_length=512, description="Source revision last synced."
    )
    short_revision: (
        Annotated[str, _fit(MAX_SHORT_REVISION_CHARS), Field(max_length=MAX_SHORT_REVISION_CHARS)]
        | None
    ) = Field(
        default=None,
        description="The revision as kubectl get shows it, e.g. main@sha1:1a2b3c4d or "
        "sha256:1a2b3c4d (revision holds the full one).",
    )
    queues: Annotated[str, _fit(MAX_QUEUES_CHARS), Field(max_length=MAX_QUEUES_CHARS)] | None = (
        Field(
            default=None,
            description="The queues of spec.queues the status describes, comma-separated, as "
            "kubectl get shows them.",
        )
    )
    published_revision: str | None = Field(
        default=None,
        max_length=512,
        description="Source revision the bindings in Airflow's database were probed at.",
    )
    last_handled_reconcile_at: str | None = Field(
        default=None,
        max_length=256,
        description="Value of the langsdk.dev/reconcile-requested-at annotation handled last.",
    )
    counts: Counts = Field(
        default_factory=Counts, description="Artifacts, handlers, bindings and unbound stubs."
    )
    artifacts: list[ArtifactStatus] = Field(
        default_factory=list,
        max_length=MAX_ARTIFACTS,
        description=f"Artifacts of the revision, failures first, at most {MAX_ARTIFACTS}.",
    )
    artifacts_omitted: int = Field(
        default=0, ge=0, description="Artifacts not listed because the list is full."
    )
    problems: list[Problem] = Field(
        default_factory=list,
        max_length=MAX_PROBLEMS,
        description=f"Problems to fix, errors first, at most {MAX_PROBLEMS}.",
    )
    problems_omitted: int = Field(
        default=0, ge=0, description="Problems not listed because the list is full."
    )
    publications: list[PublicationStatus] = Field(
        default_factory=list,
        max_length=MAX_PUBLICATIONS,
        description=f"The newest {MAX_PUBLICATIONS} publications of the bindings, newest first "
        "(the publication history in the database keeps more).",
    )
    pending_change: PendingChangeStatus | None = Field(
        default=None,
        description="The change the publish policy holds until it is approved, or a rollback "
        "keeps back; absent when nothing waits.",
    )
    pass_key: str | None = Field(
        default=None,
        max_length=80,
        description="Digest of the inputs of the last pass that changed nothing (spec, revision, "
        "listing, the bundle's Dags, its database rows); a new operator process whose first "
        "pass finds the same keeps this status instead of redoing the pass. Absent after any "
        "other pass.",
    )

    def to_body(self) -> dict[str, Any]:
        """The ``status`` stanza as written to the apiserver (camelCase, no nulls)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# Failures first, so the list never hides them behind healthy artifacts.
_STATE_ORDER = {
    ArtifactState.FAILED: 0,
    ArtifactState.REJECTED: 1,
    ArtifactState.PROBING: 2,
    ArtifactState.PENDING: 3,
    ArtifactState.PROBED: 4,
    ArtifactState.CACHED: 5,
}


def status_artifacts(items: Iterable[ArtifactStatus]) -> tuple[list[ArtifactStatus], int]:
    """The artifacts to show (failures first, then by path) and how many did not fit."""
    ordered = sorted(items, key=lambda a: (_STATE_ORDER[a.state], a.path))
    return bounded(ordered, MAX_ARTIFACTS)


def status_problems(items: Sequence[Problem]) -> tuple[list[Problem], int]:
    """The problems to show (errors first, otherwise in the given order) and the overflow."""
    ordered = sorted(items, key=lambda p: p.severity != "error")
    return bounded(ordered, MAX_PROBLEMS)

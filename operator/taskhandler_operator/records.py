"""Record types shared by the database, the protocol, validation and the scheduler (pure).

* **Declarations** (:class:`TaskHandlerDeclaration` and its params): what a runtime declares for
  one stub task. They travel in a probe's ``TaskHandlerParsingResult`` and are stored in
  ``lang_sdk_task_handler_artifact.task_handlers``, so they live here rather than in the wire
  module, which imports them.
* **Artifact and binding records** (:class:`TaskHandlerArtifact`, :class:`TaskHandlerBinding`):
  the rows of the two Airflow-named tables, as validated values; :class:`ArtifactRecord` is an
  artifact as a pass writes it (when it was probed, at which revision).
* **The scheduler's reference** (:class:`TaskHandlerArtifactRef`, :class:`BundleInfo`): what an
  ``ExecuteTask`` workload carries.
* **Ownership** (:class:`BundleOwner`): the resource that holds a bundle name's claim.
* **Problems** (:class:`BundleProblem`): one line of a bundle's problem list, as validation reports
  it and ``thop_bundle_problem`` stores it. (The other problem types are the
  listing's :class:`~taskhandler_operator.artifacts.listing.ListingProblem`, a file the walk
  refused, and the Dag reader's :class:`~taskhandler_operator.airflow.serialized.DagReadProblem`,
  something in a serialized Dag it could not read.)

Design-A variants are accepted on input (``required`` on a param; binding modes newer or older
SDKs emit), see :attr:`TaskHandlerDeclaration.mode`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from taskhandler_operator.limits import (
    CACHE_DIGEST_LENGTH,
    CLUSTER_ID_LENGTH,
    KUBE_NAME_LENGTH,
    KUBE_UID_LENGTH,
    PATH_LENGTH,
)

# A JSON Schema fragment describing one argument's value; compared only at the top level.
ArgValueSchema = dict[str, Any]

BindingMode = Literal["positional", "named"]

# Modes emitted by SDK branches that mean "match by name" for validation purposes.
NAMED_MODE_VARIANTS: frozenset[str] = frozenset({"named", "named_or_whole", "named_open"})


class _Record(BaseModel):
    """Base for records read from runtimes and rows: unknown keys are ignored."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class TaskHandlerParam(_Record):
    name: str | None = None
    value_schema: ArgValueSchema | None = None
    exact_name: bool = False
    # Design A only; Design B expresses optionality through the stub's defaults.
    required: bool | None = None


class TaskHandlerDeclaration(_Record):
    task_id: str
    # Design A had no binding field: every declaration was positional.
    binding: str = "positional"
    params: list[TaskHandlerParam] | None = None

    @property
    def mode(self) -> BindingMode | None:
        """The validation mode, or ``None`` when the SDK sent a mode we do not know."""
        if self.binding == "positional":
            return "positional"
        if self.binding in NAMED_MODE_VARIANTS:
            return "named"
        return None


TaskHandlers = dict[str, list[TaskHandlerDeclaration]]


def contains_nul(value: object) -> bool:
    """Whether a JSON value holds a NUL character in any key or string.

    Iterative, because the nesting depth of a runtime's answer is the runtime's choice.
    """
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            pending += item.keys()
            pending += item.values()
        elif isinstance(item, list | tuple):
            pending += item
    return False


class TaskHandlerArtifact(_Record):
    """A probed artifact: what Airflow calls a known artifact once it is stored."""

    bundle_name: str
    relative_fileloc: Annotated[str, Field(max_length=PATH_LENGTH)]
    size_bytes: Annotated[int, Field(ge=0)]
    cache_digest: Annotated[str, Field(max_length=CACHE_DIGEST_LENGTH)] | None = None
    task_handlers: TaskHandlers = Field(default_factory=dict)


class TaskHandlerBinding(_Record):
    dag_id: str
    task_id: str
    artifact_bundle_name: str
    artifact_rel_path: Annotated[str, Field(max_length=PATH_LENGTH)]


class BundleInfo(_Record):
    name: str
    version: str | None = None


class TaskHandlerArtifactRef(_Record):
    """What the scheduler puts on ``ExecuteTask``: the artifact to run for a stub task.

    ``bundle_info`` null means "the task's own Dag bundle"; ``rel_path`` is a POSIX path in it.
    """

    bundle_info: BundleInfo | None = None
    rel_path: str


class ArtifactRecord(BaseModel):
    """One current artifact of the bundle.

    ``probed_at`` is set when this pass probed it (the row's ``last_probed_at`` becomes that
    time and ``revision`` is recorded); None means the answer was reused from the stored row
    by the fast path, so ``last_probed_at`` is left as it was.
    """

    model_config = ConfigDict(frozen=True)

    artifact: TaskHandlerArtifact
    probed_at: datetime | None = None
    revision: str | None = None
    # The ``dag_ids`` this pass's probe asked about (None: none sent); stored beside the answer
    # so a later pass knows which Dags a filtering runtime's answer speaks for.
    requested_dag_ids: tuple[str, ...] | None = None

    @model_validator(mode="after")
    def _storable(self) -> ArtifactRecord:
        # Runtime output is untrusted. PostgreSQL's json column takes a \u0000 escape but the
        # jsonb comparison of every later pass does not, so one such declaration would fail
        # the bundle's passes forever; refuse it here, for this artifact alone.
        # Both stored forms (the column's, and the runtime's own answer kept beside it) are parts
        # of the declarations as read, so checking those covers whatever is written.
        answer = {
            dag_id: [d.model_dump(mode="json") for d in declarations]
            for dag_id, declarations in self.artifact.task_handlers.items()
        }
        if contains_nul(answer):
            raise ValueError(
                f"artifact {self.artifact.relative_fileloc!r} declares task handlers containing "
                "a NUL character, which the database cannot store"
            )
        return self


# --- problems ------------------------------------------------------------------------------------

Severity = Literal["error", "warning"]
ProblemKind = Literal[
    "unreadable", "unbound", "ambiguous", "arguments", "conflict", "empty_answer", "dag_ids"
]


class BundleProblem(BaseModel):
    """One line of a bundle's problem list (about a Dag, one of its tasks, or the bundle).

    ``message`` is complete and names the Dag and task it is about.
    """

    model_config = ConfigDict(frozen=True)

    severity: Severity
    kind: ProblemKind
    message: str
    dag_id: str | None = None
    task_id: str | None = None
    relative_fileloc: str | None = None
    # Conflicts only: the bundle whose artifact already holds the binding.
    other_bundle: str | None = None


# --- ownership ---------------------------------------------------------------------------------


class BundleOwner(BaseModel):
    """The TaskHandlerBundle that writes a bundle name's rows: who holds its claim.

    ``cluster_id`` tells apart operators of several clusters sharing one Airflow database;
    ``uid`` tells apart a deleted resource from a new one of the same name.
    """

    model_config = ConfigDict(frozen=True)

    cluster_id: Annotated[str, Field(min_length=1, max_length=CLUSTER_ID_LENGTH)]
    namespace: Annotated[str, Field(min_length=1, max_length=KUBE_NAME_LENGTH)]
    name: Annotated[str, Field(min_length=1, max_length=KUBE_NAME_LENGTH)]
    uid: Annotated[str, Field(min_length=1, max_length=KUBE_UID_LENGTH)]

    def describe(self) -> str:
        return f"TaskHandlerBundle {self.namespace}/{self.name} in cluster {self.cluster_id!r}"

    def same_resource(self, other: BundleOwner) -> bool:
        """The same cluster, namespace and name (the uid may differ: recreated)."""
        return (self.cluster_id, self.namespace, self.name) == (
            other.cluster_id,
            other.namespace,
            other.name,
        )

"""The TaskHandlerBundle spec: what a user writes (DESIGN §3.2).

These models are the source of truth twice: the operator validates ``spec`` with them, and
``kube/crd.py`` generates the CRD's OpenAPI schema from them, so a field's description here is
what ``kubectl explain thb.spec.<field>`` prints. Every field has a description (a unit test
checks it); camelCase on the wire, snake_case in Python.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)
from pydantic.alias_generators import to_camel

from taskhandler_operator.artifacts.models import Language
from taskhandler_operator.kube.duration import Duration
from taskhandler_operator.kube.markers import (
    Cel,
    ListType,
    Quantity,
    cel_string,
    check_pattern,
    quantity_value,
)
from taskhandler_operator.publication.policy import PublishPolicy
from taskhandler_operator.sources.spec import SourceSpec

__all__ = [
    "BUNDLE_NAME_PATTERN",
    "MAX_PARALLELISM",
    "MAX_QUEUES",
    "QUEUE_PATTERN",
    "DeletionPolicy",
    "Language",
    "ProbeSpec",
    "ResourceRequirements",
    "TaskHandlerBundleSpec",
    "Toleration",
]

# Airflow stores bundle names in String(250) columns and uses them in folder names.
BUNDLE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
BUNDLE_NAME_MESSAGE = (
    "bundleName must start with a letter or digit and contain only letters, digits, '.', "
    "'_' and '-'"
)
MAX_BUNDLE_NAME_CHARS = 250
BUNDLE_NAME_IMMUTABLE_MESSAGE = (
    "bundleName is immutable: create a new TaskHandlerBundle to serve another bundle name"
)

# Airflow's task_instance.queue is String(256); the pattern refuses blanks and stray spaces.
QUEUE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]*$"
QUEUE_MESSAGE = (
    "queue names must start with a letter or digit and contain only letters, digits, "
    "'.', '_', ':' and '-'"
)
MAX_QUEUE_CHARS = 256
MAX_QUEUES = 64

MIN_PARALLELISM = 1
MAX_PARALLELISM = 32
PARALLELISM_MESSAGE = f"probe.parallelism must be between {MIN_PARALLELISM} and {MAX_PARALLELISM}"

SOURCE_KINDS = ("git", "http", "s3", "volume")
SOURCE_MESSAGE = "source must name exactly one of git, http, s3, volume"
_SOURCE_RULE = " + ".join(f"(has(self.{kind}) ? 1 : 0)" for kind in SOURCE_KINDS) + " == 1"

MAX_RESOURCE_ENTRIES = 16
MAX_NODE_SELECTOR_ENTRIES = 32
MAX_TOLERATIONS = 32


class _Spec(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class DeletionPolicy(StrEnum):
    """What happens to the bundle's binding rows when the TaskHandlerBundle is deleted."""

    DELETE = "Delete"
    ORPHAN = "Orphan"


def _check_parallelism(value: int) -> int:
    if not MIN_PARALLELISM <= value <= MAX_PARALLELISM:
        raise ValueError(PARALLELISM_MESSAGE)
    return value


def _one_source_kind(value: object) -> object:
    # Checked before SourceSpec itself validates, so the model and the CRD's CEL rule give
    # the same message whatever wording the sources module uses.
    if isinstance(value, Mapping):
        given = [kind for kind in SOURCE_KINDS if value.get(kind) is not None]
        if len(given) != 1:
            raise ValueError(SOURCE_MESSAGE + (f" (got {', '.join(given)})" if given else ""))
    return value


def _unique(values: list[str]) -> list[str]:
    duplicates = sorted(v for v, n in Counter(values).items() if n > 1)
    if duplicates:
        raise ValueError(f"queues are listed twice: {', '.join(duplicates)}")
    return values


BundleName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_BUNDLE_NAME_CHARS),
    check_pattern(BUNDLE_NAME_PATTERN, BUNDLE_NAME_MESSAGE),
    Cel(f"self.matches({cel_string(BUNDLE_NAME_PATTERN)})", BUNDLE_NAME_MESSAGE),
    Cel("self == oldSelf", BUNDLE_NAME_IMMUTABLE_MESSAGE),
]

QueueName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_QUEUE_CHARS),
    check_pattern(QUEUE_PATTERN, QUEUE_MESSAGE),
    Cel(f"self.matches({cel_string(QUEUE_PATTERN)})", QUEUE_MESSAGE),
]

Parallelism = Annotated[
    int,
    AfterValidator(_check_parallelism),
    Cel(f"self >= {MIN_PARALLELISM} && self <= {MAX_PARALLELISM}", PARALLELISM_MESSAGE),
]


class ResourceRequirements(_Spec):
    """CPU and memory for the probe containers, as in a Pod's ``resources``. Entries left out
    take the operator's defaults."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict,
        max_length=MAX_RESOURCE_ENTRIES,
        description="Minimum resources the scheduler reserves, e.g. {cpu: 100m, memory: 128Mi}.",
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict,
        max_length=MAX_RESOURCE_ENTRIES,
        description="Maximum resources a probe container may use; over the memory limit it is "
        "OOM-killed and the artifact is reported as failed.",
    )

    @model_validator(mode="after")
    def _requests_within_limits(self) -> ResourceRequirements:
        for name in sorted(self.requests.keys() & self.limits.keys()):
            request, limit = self.requests[name], self.limits[name]
            if quantity_value(request) > quantity_value(limit):
                raise ValueError(
                    f"probe.resources: requests.{name} ({request}) is above limits.{name} ({limit})"
                )
        return self


class Toleration(_Spec):
    """Lets probe pods run on nodes with a matching taint, as in a Pod's ``tolerations``."""

    key: str | None = Field(
        default=None, description="Taint key to match; empty with operator Exists matches all."
    )
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Exists or Equal (the default): how key and value are compared."
    )
    value: str | None = Field(default=None, description="Taint value to match (operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        default=None,
        description="For NoExecute: how long the pod stays bound after the taint appears.",
    )


class ProbeSpec(_Spec):
    """How the bundle's artifacts are probed: one Kubernetes Job per artifact to probe."""

    image: str | None = Field(
        default=None,
        min_length=1,
        description="Container image running the probe driver and the artifact, instead of the "
        "operator's configured runtime image for the bundle's language.",
    )
    timeout: Duration = Field(
        default="1m",
        description="How long a started runtime has to answer the parse request. The probe "
        "Job's deadline adds the download time and a scheduling allowance to it.",
    )
    parallelism: Parallelism = Field(
        default=4,
        description=f"Most probe Jobs of this bundle running at once ({MIN_PARALLELISM} to "
        f"{MAX_PARALLELISM}); the operator also has a global cap.",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="Requests and limits of the probe containers; unset entries take the "
        "operator's defaults.",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_NODE_SELECTOR_ENTRIES,
        description="Node labels a probe pod's node must have.",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=MAX_TOLERATIONS,
        description="Taints probe pods tolerate.",
    )


class PublishSpec(_Spec):
    """When a revision's bindings are published (docs/operator.md, "Publication under
    control")."""

    policy: PublishPolicy = Field(
        default=PublishPolicy.AUTOMATIC,
        description="Automatic publishes every change; NoRemoval holds a change that leaves a "
        "task bound today without a binding (or moves one to or from an artifact whose probe "
        "failed); Manual holds every change. A held change is published by the annotation "
        "langsdk.dev/approve-revision=<revision>.",
    )


class TaskHandlerBundleSpec(_Spec):
    """A bundle of Lang-SDK artifacts whose task handlers serve Airflow ``@task.stub`` tasks."""

    bundle_name: BundleName = Field(
        description="Airflow Dag bundle name the artifacts belong to (the bundle_name of the "
        "binding rows). One TaskHandlerBundle per bundle name; immutable.",
    )
    language: Language = Field(
        description="Language of the artifacts: go (executables), java (JARs) or typescript "
        "(.min.mjs files).",
    )
    queues: Annotated[
        list[QueueName],
        Field(min_length=1, max_length=MAX_QUEUES),
        AfterValidator(_unique),
        ListType("set"),
    ] = Field(
        description="The @task.stub queues this bundle serves. Every stub on these queues must "
        "be claimed by exactly one artifact; a queue belongs to one TaskHandlerBundle.",
    )
    source: Annotated[
        SourceSpec, BeforeValidator(_one_source_kind), Cel(_SOURCE_RULE, SOURCE_MESSAGE)
    ] = Field(
        description="Where the bundle's files come from: exactly one of git, http, s3, volume.",
    )
    interval: Duration = Field(
        default="5m",
        description="How often the source is checked for a new revision (with a little "
        "jitter); the annotation langsdk.dev/reconcile-requested-at asks for a check now.",
    )
    timeout: Duration = Field(
        default="2m",
        description="How long one sync of the source may take before it counts as failed.",
    )
    suspend: bool = Field(
        default=False,
        description="Stop all work on this bundle (no sync, no probes, no writes); bindings "
        "already written stay.",
    )
    probe: ProbeSpec = Field(
        default_factory=ProbeSpec, description="How the artifacts are probed (Kubernetes Jobs)."
    )
    publish: PublishSpec = Field(
        default_factory=PublishSpec,
        description="When the bindings of a new revision are published: at once, or held for "
        "an approval.",
    )
    deletion_policy: DeletionPolicy = Field(
        default=DeletionPolicy.DELETE,
        description="On deletion of this resource: Delete removes the bundle's binding rows "
        "from Airflow's database, Orphan leaves them for Airflow to keep using.",
    )

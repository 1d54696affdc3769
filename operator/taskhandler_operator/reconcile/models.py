"""The typed inputs and outputs of the reconcile steps (pure; no I/O).

Each step of :mod:`.steps` takes the outputs of the ones before it and returns one of these,
so a step can be tested on hand-built values and a caller (the controller, the demo) can show
or publish what each step found.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from taskhandler_operator.airflow.serialized import DagStubs
from taskhandler_operator.artifacts.listing import ListingProblem, ListingStats
from taskhandler_operator.artifacts.models import Candidate, Language
from taskhandler_operator.artifacts.planner import ProbePlan
from taskhandler_operator.protocol.messages import TaskHandlerParsingResult
from taskhandler_operator.protocol.summary import ProbeSummary
from taskhandler_operator.publication.policy import PublishControl
from taskhandler_operator.records import (
    ArtifactRecord,
    BundleOwner,
    BundleProblem,
    TaskHandlerArtifact,
)
from taskhandler_operator.validation import ValidationResult

StepName = Literal["sync", "list", "plan", "probe", "validate", "write", "summarize"]
#: The steps of a pass, in order (DESIGN.md §1's diagram).
STEPS: tuple[StepName, ...] = ("sync", "list", "plan", "probe", "validate", "write", "summarize")


class BundleSpec(BaseModel):
    """What a pass needs to know about one TaskHandlerBundle."""

    model_config = ConfigDict(frozen=True)

    bundle_name: Annotated[str, Field(min_length=1)]
    language: Language
    # The stub queues this bundle serves; validated and claimed.
    queues: Annotated[tuple[str, ...], Field(min_length=1)]
    owner: BundleOwner
    # The publish policy, approval and rollback asked for, and who writes (the pass adds the
    # revision and the failed artifacts).
    publish: PublishControl = PublishControl()


@dataclass(frozen=True)
class SyncedRevision:
    """The source, synced: an immutable folder and the revision it holds."""

    revision: str
    root: Path


@dataclass(frozen=True)
class Listed:
    candidates: tuple[Candidate, ...]
    # Files the listing refused or could not read (a symlink out of the root, ...).
    problems: tuple[ListingProblem, ...]
    stats: ListingStats


@dataclass(frozen=True)
class Planned:
    plan: ProbePlan[TaskHandlerArtifact]
    known: int  # stored answers of the bundle the plan compared against
    # The ``dag_ids`` every probe of this pass sends: the Dags with a stub on the bundle's
    # queues (None: none sent, with ``dag_ids_problem`` saying why when there were too many).
    dag_ids: tuple[str, ...] | None = None
    dag_ids_problem: str | None = None


@dataclass(frozen=True)
class ProbeRequest:
    """One artifact to probe: where its bundle is, which candidate, at which revision."""

    bundle_name: str
    language: Language
    bundle_root: Path
    candidate: Candidate
    revision: str
    # Sent as the request's ``dag_ids`` (docs/protocol.md, "dag_ids"); None sends none.
    dag_ids: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ProbeAccepted:
    rel_path: str
    result: TaskHandlerParsingResult
    # What the prober knows beyond the result (the driver's summary, the command it ran).
    summary: ProbeSummary | None = None
    command: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProbeFailed:
    rel_path: str
    reason: str  # one line a Dag author can act on
    # Worth trying sooner than the next interval (the prober broke, not the artifact).
    retryable: bool = False
    summary: ProbeSummary | None = None
    command: tuple[str, ...] = ()


ProbeOutcome = ProbeAccepted | ProbeFailed


@dataclass(frozen=True)
class Probed:
    """The bundle's current answers (reused and fresh) and the artifacts that gave none."""

    records: tuple[ArtifactRecord, ...]
    accepted: tuple[ProbeAccepted, ...] = ()
    failures: tuple[ProbeFailed, ...] = ()


@dataclass(frozen=True)
class Validated:
    result: ValidationResult
    dags: Mapping[str, DagStubs] = field(repr=False)


class PassCounts(BaseModel):
    model_config = ConfigDict(frozen=True)

    candidates: int = 0
    cached: int = 0
    probed: int = 0
    rejected: int = 0
    failed: int = 0
    handlers: int = 0
    bindings: int = 0


class ArtifactIssue(BaseModel):
    """An artifact (or file) that gave no answer this pass, and why."""

    model_config = ConfigDict(frozen=True)

    rel_path: str
    kind: Literal["rejected", "probe_failed", "listing"]
    reason: str


class PassSummary(BaseModel):
    """What one pass observed and did: the controller's status is written from this alone."""

    model_config = ConfigDict(frozen=True)

    bundle_name: str
    revision: str
    started_at: datetime
    counts: PassCounts
    artifact_issues: tuple[ArtifactIssue, ...] = ()
    problems: tuple[BundleProblem, ...] = ()
    dag_outcomes: dict[str, Literal["reconciled", "kept", "conflict"]] = Field(default_factory=dict)
    rows_written: int = 0
    statements: int = 0
    step_seconds: dict[str, float] = Field(default_factory=dict)
    # True: nothing changed since the last pass, whose outcome this is (no load, no write).
    reused: bool = False
    # Handlers each current answer declares, by artifact path (the status shows them).
    handlers_by_path: dict[str, int] = Field(default_factory=dict)

    @property
    def errors(self) -> tuple[BundleProblem, ...]:
        return tuple(p for p in self.problems if p.severity == "error")

"""The write path's inputs and results (validated values; no statements, no I/O).

:class:`BundlePass` is what one pass of one bundle hands to ``writer.write_pass``: the bundle's
current artifacts (:class:`ArtifactRecord`), a verdict per Dag it concerns, and who writes it.
:class:`PassResult` says what the pass changed, row by row.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SkipValidation, model_validator

from taskhandler_operator.publication.history import PublishOutcome
from taskhandler_operator.publication.policy import PublishControl
from taskhandler_operator.records import ArtifactRecord, BundleOwner, BundleProblem
from taskhandler_operator.validation import DagVerdict

DagOutcome = Literal["reconciled", "kept", "conflict"]


class BundlePass(BaseModel):
    """Everything one pass of one bundle writes, and who writes it.

    ``owner`` must hold the bundle name's claim (it is taken when free); ``queues`` are the stub
    queues the bundle serves, claimed with it (a queue no longer listed is released).
    """

    model_config = ConfigDict(frozen=True)

    bundle_name: str
    owner: BundleOwner
    queues: tuple[str, ...]
    artifacts: tuple[ArtifactRecord, ...] = ()
    verdicts: tuple[DagVerdict, ...] = ()
    # The Dags of Airflow's stub inventory (its keys, not copied nor validated: a thousand).
    # A Dag among them without a verdict is reconciled to no binding: the writer removes the
    # bundle's rows of it, as a verdict without bindings would. So a pass validates only the
    # Dags of its own queues, and its rows of a Dag that lost its stubs or moved queue still
    # go. None: only the verdicts' Dags are touched (a Dag Airflow no longer has keeps its rows
    # either way).
    inventory_dags: Annotated[AbstractSet[str] | None, SkipValidation] = None
    # Problems about the bundle as a whole (no Dag), stored beside the Dags' own.
    problems: tuple[BundleProblem, ...] = ()
    # Delete this bundle's artifact rows that are not in ``artifacts`` and have no binding.
    sweep_orphans: bool = True
    # The publish policy, the revision and the approval or rollback asked for (publication/).
    publish: PublishControl = PublishControl()

    def unjudged(self, held: Iterable[str]) -> list[str]:
        """Of the Dags the bundle has rows of (``held``), those of the inventory without a
        verdict, sorted: the pass reconciles them to no binding (``inventory_dags``)."""
        inventory = self.inventory_dags
        if inventory is None:
            return []
        judged = {v.dag_id for v in self.verdicts}
        return sorted({d for d in held if d not in judged and d in inventory})

    @model_validator(mode="after")
    def _consistent(self) -> BundlePass:
        paths: set[str] = set()
        for record in self.artifacts:
            artifact = record.artifact
            if artifact.bundle_name != self.bundle_name:
                raise ValueError(
                    f"artifact {artifact.relative_fileloc!r} belongs to bundle "
                    f"{artifact.bundle_name!r}, not {self.bundle_name!r}"
                )
            if artifact.relative_fileloc in paths:
                raise ValueError(f"artifact {artifact.relative_fileloc!r} is listed twice")
            paths.add(artifact.relative_fileloc)
        dag_ids: set[str] = set()
        for verdict in self.verdicts:
            if verdict.dag_id in dag_ids:
                raise ValueError(f"Dag {verdict.dag_id!r} has two verdicts")
            dag_ids.add(verdict.dag_id)
            for binding in verdict.bindings or ():
                if binding.dag_id != verdict.dag_id:
                    raise ValueError(
                        f"Dag {verdict.dag_id!r} carries a binding of Dag {binding.dag_id!r}"
                    )
                if binding.artifact_bundle_name != self.bundle_name:
                    raise ValueError(
                        f"Dag {verdict.dag_id!r}, task {binding.task_id!r} is bound to bundle "
                        f"{binding.artifact_bundle_name!r}, not {self.bundle_name!r}"
                    )
                if binding.artifact_rel_path not in paths:
                    raise ValueError(
                        f"Dag {verdict.dag_id!r}, task {binding.task_id!r} is bound to "
                        f"{binding.artifact_rel_path!r}, which is not among the pass's artifacts"
                    )
        return self


class BindingConflict(BaseModel):
    """A ``(dag_id, task_id)`` two bundles claim; ``holder`` has the row, ``claimant`` wants it."""

    model_config = ConfigDict(frozen=True)

    dag_id: str
    task_id: str
    claimant_bundle: str
    holder_bundle: str
    holder_rel_path: str | None = None

    def message(self) -> str:
        held = f" ({self.holder_rel_path!r})" if self.holder_rel_path else ""
        return (
            f"Dag {self.dag_id!r}, task {self.task_id!r}: already bound to an artifact of "
            f"bundle {self.holder_bundle!r}{held}; bundle {self.claimant_bundle!r} also "
            "registers it, so the binding was not changed"
        )


class PassResult(BaseModel):
    bundle_name: str
    artifacts_inserted: int = 0
    artifacts_updated: int = 0
    artifacts_deleted: int = 0
    probes_written: int = 0
    bindings_inserted: int = 0
    bindings_updated: int = 0
    bindings_deleted: int = 0
    problems_inserted: int = 0
    problems_deleted: int = 0
    # Bindings this bundle wanted that another bundle holds.
    conflicts: tuple[BindingConflict, ...] = ()
    # Bindings this bundle holds that another bundle also claims.
    held_conflicts: tuple[BindingConflict, ...] = ()
    dag_outcomes: dict[str, DagOutcome] = Field(default_factory=dict)
    # Ownership rows: the bundle's claim taken (first pass) and queue claims taken or released.
    claim_taken: bool = False
    queues_claimed: int = 0
    queues_released: int = 0
    # History rows written or dropped (a publication, the held change).
    publications_written: int = 0
    # What the pass did about publishing: recorded, held, rolled back, refused.
    publication: PublishOutcome | None = None
    statements: int = 0

    @property
    def rows_written(self) -> int:
        return (
            self.artifacts_inserted
            + self.artifacts_updated
            + self.artifacts_deleted
            + self.probes_written
            + self.bindings_inserted
            + self.bindings_updated
            + self.bindings_deleted
            + self.problems_inserted
            + self.problems_deleted
            + int(self.claim_taken)
            + self.queues_claimed
            + self.queues_released
            + self.publications_written
        )


class ArtifactCounts(BaseModel):
    inserted: int
    updated: int
    probes_written: int


class BundleRowsDeleted(BaseModel):
    bindings: int
    artifacts: int
    problems: int
    # Whether the bundle's claim (and with it its queue claims) was held and dropped.
    claim_released: bool = False

"""The fast path: which candidates reuse a recorded answer, which are probed, which rejected.

Pure data in, pure data out (reference airflow-langsdk.md §8.3). Each candidate is
decided on its own, in listing order:

* a candidate with a listing error is rejected, even when a record matches it;
* same relative path, same size and the same non-null stored digest as a known
  artifact of the bundle: cached, the whole recorded answer is reused;
* anything else is probed, including a candidate that stores no digest.

Modification times are never consulted: a re-synced bundle has new mtimes and the
same content, and a stored digest is what says "unchanged".

A cached answer must also still speak for the Dags the bundle serves: an answer from a runtime
that filters by the request's ``dag_ids`` covers only the Dags it was asked about
(:func:`answer_covers`, :func:`recheck_coverage`; docs/protocol.md, "dag_ids").
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from taskhandler_operator.artifacts.models import Candidate
from taskhandler_operator.limits import MAX_REQUEST_DAG_ID_BYTES, MAX_REQUEST_DAG_IDS


class KnownArtifactLike(Protocol):
    """Anything shaped like Airflow's ``TaskHandlerArtifact`` (a DB row, a pydantic model)."""

    @property
    def bundle_name(self) -> str: ...
    @property
    def relative_fileloc(self) -> str: ...
    @property
    def size_bytes(self) -> int: ...
    @property
    def cache_digest(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class KnownArtifact:
    """A previous probe answer: one ``lang_sdk_task_handler_artifact`` row as plain data."""

    bundle_name: str
    relative_fileloc: str
    size_bytes: int
    cache_digest: str | None
    task_handlers: Mapping[str, Any] = field(default_factory=dict)


K = TypeVar("K", bound=KnownArtifactLike)


@dataclass(frozen=True)
class ProbePlan(Generic[K]):
    cached: list[tuple[Candidate, K]]
    probe: list[Candidate]
    rejected: list[Candidate]


def plan_probes(
    candidates: Iterable[Candidate], known: Iterable[K], bundle_name: str
) -> ProbePlan[K]:
    """Split ``candidates`` of ``bundle_name`` into cached, probe and rejected."""
    by_path: dict[str, K] = {}
    for artifact in known:
        if artifact.bundle_name == bundle_name:
            # The table is unique per (bundle, path); keep the first if a caller repeats one.
            by_path.setdefault(artifact.relative_fileloc, artifact)
    cached: list[tuple[Candidate, K]] = []
    probe: list[Candidate] = []
    rejected: list[Candidate] = []
    for candidate in candidates:
        if candidate.error is not None:
            rejected.append(candidate)
            continue
        record = by_path.get(candidate.rel_path)
        if (
            candidate.cache_digest is not None
            and record is not None
            and record.size_bytes == candidate.size_bytes
            and record.cache_digest == candidate.cache_digest
        ):
            cached.append((candidate, record))
        else:
            probe.append(candidate)
    return ProbePlan(cached, probe, rejected)


def answer_covers(
    requested: Collection[str] | None,
    answered: Collection[str],
    wanted: Collection[str],
) -> bool:
    """Whether a recorded answer still speaks for every Dag in ``wanted``.

    ``requested`` is the ``dag_ids`` the probe sent (None: none), ``answered`` the Dags the
    answer declares, ``wanted`` the Dags with stubs on the bundle's queues now. Runtimes of
    the current protocol ignore ``dag_ids`` and answer everything; older ones (Design A)
    answer only the Dags requested. So an answer is complete when nothing was requested, or
    when it declares a Dag that was not requested (its runtime does not filter); otherwise it
    may have been filtered and covers only what was requested. A cached answer that does not
    cover ``wanted`` must be probed again (docs/protocol.md, "dag_ids").
    """
    if requested is None:
        return True
    requested_set = frozenset(requested)
    if not frozenset(answered) <= requested_set:
        return True
    return frozenset(wanted) <= requested_set


def recheck_coverage(
    plan: ProbePlan[K],
    requested: Mapping[str, Collection[str] | None],
    wanted: Collection[str],
    answered: Mapping[str, Collection[str]],
) -> ProbePlan[K]:
    """``plan`` with every cached answer that no longer covers ``wanted`` moved to the probes.

    ``requested`` is the ``dag_ids`` each stored answer was asked with, by relative path (a path
    missing from it was asked nothing: Airflow's own rows, or answers from before the operator
    sent ``dag_ids``); ``answered`` the Dags each cached answer declares. The candidates keep
    their listing order.
    """
    stale = {
        candidate.rel_path
        for candidate, _record in plan.cached
        if not answer_covers(
            requested.get(candidate.rel_path), answered.get(candidate.rel_path, ()), wanted
        )
    }
    if not stale:
        return plan
    return ProbePlan(
        cached=[(c, r) for c, r in plan.cached if c.rel_path not in stale],
        probe=sorted(
            [*plan.probe, *(c for c, _r in plan.cached if c.rel_path in stale)],
            key=lambda c: c.rel_path,
        ),
        rejected=plan.rejected,
    )


def request_dag_ids(wanted: Collection[str]) -> tuple[tuple[str, ...] | None, str | None]:
    """The ``dag_ids`` a probe request carries for a bundle whose stubs are in ``wanted``.

    Sorted and de-duplicated; ``(None, reason)`` when they do not fit one request (more than
    :data:`MAX_REQUEST_DAG_IDS` ids, or more than :data:`MAX_REQUEST_DAG_ID_BYTES` in all: they
    travel as the probe container's arguments). Then nothing is sent, which every runtime of
    the current protocol answers in full, and the reason says that a runtime that answers only
    the Dags it is asked about will answer none: reported, never cut silently.
    """
    ids = tuple(sorted(set(wanted)))
    size = sum(len(d.encode()) for d in ids)
    if len(ids) <= MAX_REQUEST_DAG_IDS and size <= MAX_REQUEST_DAG_ID_BYTES:
        return ids, None
    return None, (
        f"the bundle's queues have stub tasks in {len(ids)} Dags ({size} bytes of Dag ids), more "
        f"than one probe request carries ({MAX_REQUEST_DAG_IDS} ids, {MAX_REQUEST_DAG_ID_BYTES} "
        "bytes): probes send no dag_ids. Runtimes of the current protocol answer in full; an "
        "older runtime that answers only the Dags it is asked about answers none. Split the "
        "queues over more TaskHandlerBundles"
    )

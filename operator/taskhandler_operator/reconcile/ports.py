"""What a reconcile pass needs from the outside world, as protocols (pure; no I/O here).

The pass (:mod:`.steps`) is handed one object per port, so each step runs in a unit test with
an in-memory stand-in and in production with the real thing:

* :class:`Syncer`: makes the bundle's source available as a revision folder (the ``sources``
  package; :class:`~taskhandler_operator.reconcile.local.LocalFolderSyncer` for a plain folder);
* :class:`Prober`: asks one artifact which task handlers it registers (a probe Job in a
  cluster; :class:`~taskhandler_operator.reconcile.local.SubprocessProber` runs the real probe
  driver as a local process);
* ``Store`` (in :mod:`.store`, beside its database implementation): known artifacts, the stub
  inventory, the write;
* :class:`ClaimCheck`: whether the bundle's write would be refused for ownership, asked before
  anything is probed (the controller's also takes over a claim whose holder is gone);
* :class:`Clock`: wall time for ``probed_at``, a monotonic clock for step durations;
* :class:`Progress` (optional): told when the pass starts probing, so the caller can say so
  (the controller writes ``Reconciling=True``, ``Probing``) before probes that may take minutes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Protocol

from taskhandler_operator.artifacts.models import Candidate
from taskhandler_operator.reconcile.models import (
    BundleSpec,
    ProbeAccepted,
    ProbeFailed,
    ProbeRequest,
    SyncedRevision,
)


class Syncer(Protocol):
    async def __call__(self, spec: BundleSpec) -> SyncedRevision:
        """The bundle's source as an immutable revision folder; raises on failure."""
        ...


class Prober(Protocol):
    async def __call__(self, request: ProbeRequest) -> ProbeAccepted | ProbeFailed:
        """One artifact's answer, or why there is none. Raises only for a broken prober."""
        ...


class ClaimCheck(Protocol):
    async def __call__(self, spec: BundleSpec) -> None:
        """Raise the ownership conflict the write would raise (another resource holds the
        bundle name or a queue); return when the pass may go on."""


class Progress(Protocol):
    async def probing(self, revision: str, candidates: Sequence[Candidate]) -> None:
        """The pass is about to probe ``candidates`` of ``revision``. Must not raise: a report
        that cannot be made must not fail the pass."""
        ...


class Clock(Protocol):
    def now(self) -> datetime:
        """Aware wall-clock time (UTC)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back, for durations."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

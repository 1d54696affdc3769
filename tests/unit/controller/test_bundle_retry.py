"""The retry decisions of controller/bundle.py: after which pass the loop backs off, resets,
or waits for the interval (random injected, so every delay is exact)."""

from __future__ import annotations

import random

import pytest

from taskhandler_operator.controller.backoff import Backoff
from taskhandler_operator.controller.bundle import RETRY, PassReport, retry_after, sleep_after
from taskhandler_operator.controller.syncing import SourceSyncFailed
from taskhandler_operator.db.claims import QueueClaimed
from taskhandler_operator.db.engine import DatabaseUnavailable, PermissionDenied
from taskhandler_operator.kube.status import TaskHandlerBundleStatus
from taskhandler_operator.reconcile.errors import DatabaseFailed, OwnershipConflict, ProberFailed
from taskhandler_operator.records import BundleOwner


class Highest(random.Random):
    """Every draw is the top of its range: the longest delays the policy allows."""

    def uniform(self, a: float, b: float) -> float:
        return b


class Lowest(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return a


SOURCE = SourceSyncFailed(
    "git host unreachable", reason="SourceUnreachable", kind="network", retryable=True
)
DATABASE = DatabaseFailed("write", DatabaseUnavailable("connection refused"))
OWNER = BundleOwner(cluster_id="c", namespace="a", name="q", uid="u")


def test_retryable_failures_back_off_exponentially_to_the_cap_and_success_resets() -> None:
    retry = RETRY.start(Highest())
    delays = [retry_after(error, retry) for error in (SOURCE, DATABASE, SOURCE, SOURCE, SOURCE)]
    # Decorrelated jitter at its top: 3x the previous, from base 5 s, capped at 300 s.
    assert delays == [15.0, 45.0, 135.0, 300.0, 300.0]
    assert retry.failing
    assert retry_after(None, retry) is None and not retry.failing
    assert retry_after(SOURCE, retry) == 15.0  # starts over after a success


def test_jitter_spreads_bundles_failing_together_and_never_leaves_the_bounds() -> None:
    firsts = {retry_after(SOURCE, RETRY.start(random.Random(seed))) for seed in range(50)}
    assert len(firsts) == 50  # fifty bundles failing at once do not retry in the same second
    retry = RETRY.start(random.Random(7))
    for _ in range(40):
        delay = retry_after(DATABASE, retry)
        assert delay is not None and RETRY.base <= delay <= RETRY.cap
    lowest = RETRY.start(Lowest())
    assert [retry_after(SOURCE, lowest) for _ in range(3)] == [5.0, 5.0, 5.0]


@pytest.mark.parametrize(
    "error",
    [
        OwnershipConflict("write", QueueClaimed("java", "orders", OWNER)),
        DatabaseFailed(
            "write", PermissionDenied("permission denied for table task_handler_binding")
        ),
    ],
)
def test_a_non_retryable_failure_waits_for_a_change_without_growing_the_back_off(
    error: Exception,
) -> None:
    retry = RETRY.start(Highest())
    assert retry_after(SOURCE, retry) == 15.0
    assert retry_after(error, retry) is None  # type: ignore[arg-type]
    assert retry.attempt == 1  # the back-off is neither grown nor reset


def test_a_prober_failure_is_retried() -> None:
    assert retry_after(ProberFailed("probe", "apiserver said 500"), RETRY.start(Lowest())) == 5.0


def test_the_loop_sleeps_the_back_off_or_the_jittered_interval() -> None:
    status = TaskHandlerBundleStatus()
    failing = PassReport(status, written=False, retry_in=45.0, interval=3600.0)
    assert sleep_after(failing, Highest()) == 45.0
    fine = PassReport(status, written=False, retry_in=None, interval=3600.0)
    assert sleep_after(fine, Highest()) == pytest.approx(3600.0 * 1.2)
    assert sleep_after(fine, Lowest()) == pytest.approx(3600.0 * 0.8)
    # An artifact's probe back-off that ends before the interval wakes the loop for it.
    waiting = PassReport(status, written=False, retry_in=None, interval=3600.0, probe_due=12.0)
    assert sleep_after(waiting, Highest()) == 12.0
    later = PassReport(status, written=False, retry_in=None, interval=10.0, probe_due=500.0)
    assert sleep_after(later, Lowest()) == pytest.approx(8.0)


def test_the_policy_is_capped_exponential() -> None:
    assert (RETRY.base, RETRY.cap) == (5.0, 300.0)
    assert isinstance(RETRY, Backoff)
